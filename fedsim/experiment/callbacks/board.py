"""The run's config and final metrics in TensorBoard's HParams tab (see
`fedsim.reporting.hparams`), written when the run completes."""

from __future__ import annotations

from fedsim.experiment.callbacks.base import Callback
from fedsim.experiment.run_state import Run, final_metrics
from fedsim.metric_names import (CUMULATIVE_AGGREGATE_BITS, CUMULATIVE_BROADCAST_BITS,
                                 EVAL_ACCURACY, EVAL_LOSS, TRAIN_LOSS)
from fedsim.reporting import flat_hparams, write_hparams

# The final metrics of the HParams table, in its column order.
FINAL_METRICS = (EVAL_ACCURACY, EVAL_LOSS, TRAIN_LOSS, CUMULATIVE_BROADCAST_BITS,
                 CUMULATIVE_AGGREGATE_BITS)


class HParams(Callback):

  def on_end(self, run: Run) -> None:
    final = final_metrics(run.history)
    write_hparams(run.run_dir, flat_hparams(run.plain_config),
                  {k: final[k] for k in FINAL_METRICS if k in final},
                  step=run.sim.config.rounds)
