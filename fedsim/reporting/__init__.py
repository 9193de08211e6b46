"""Run outputs: the run directory, metrics.csv, TensorBoard, progress bar.

TensorFlow is imported only when a TensorBoard sink or hparams are written.
"""

from fedsim.reporting.hparams import flat_hparams
from fedsim.reporting.progress import Progress
from fedsim.reporting.rundir import (create_run_dir, mark_failed, mark_interrupted,
                                     read_status, write_config, write_status)
from fedsim.reporting.sinks import (CompositeSink, CsvSink, MetricsSink, TensorBoardSink,
                                    read_metrics_csv)
from fedsim.reporting.units import format_bits

__all__ = [
    "CompositeSink", "CsvSink", "MetricsSink", "Progress", "TensorBoardSink",
    "create_run_dir", "flat_hparams", "format_bits", "mark_failed", "mark_interrupted",
    "read_metrics_csv",
    "read_status",
    "write_config", "write_status",
]
