"""metrics.csv (one row of metrics per round) and clients.csv (who took part).

On resume both are cut back to the checkpoint's round, and the rows kept
become `run.history`: metrics.csv is where the past rounds' metrics live.
"""

from __future__ import annotations

from fedsim.experiment.callbacks.callback import Callback
from fedsim.experiment.callbacks.closing import close_quietly
from fedsim.experiment.round_result import RoundResult
from fedsim.experiment.run_state import Run
from fedsim.reporting import CsvSink, read_metrics_csv

METRICS_CSV = "metrics.csv"
CLIENTS_CSV = "clients.csv"  # round, sampled, aggregated, staleness (see RoundResult.clients_row)


class CsvLogs(Callback):

  def __init__(self):
    self._metrics = self._clients = None

  def on_start(self, run: Run) -> None:
    cut = run.start if run.resume_from is not None else None
    self._metrics = CsvSink(run.run_dir / METRICS_CSV, resume_after_round=cut)
    if run.start and self._metrics.path.exists():
      run.history = read_metrics_csv(self._metrics.path)
    self._clients = CsvSink(run.run_dir / CLIENTS_CSV, resume_after_round=cut)

  def after_round(self, run: Run, record: RoundResult) -> None:
    self._clients.write(run.round_num, record.clients_row())
    self._metrics.write(run.round_num, record.metrics)

  def on_end(self, run: Run) -> None:
    for sink in (self._metrics, self._clients):
      sink.close()  # Flushes: a full disk shows here, before 'completed'.

  def on_error(self, run: Run, error: BaseException) -> None:
    close_quietly(self._metrics, self._clients)
