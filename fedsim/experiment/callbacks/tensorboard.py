"""TensorBoard scalars, all in the run directory (one TensorBoard run per run
directory): every metric by round, and eval accuracy again under its own tags
against cumulative bits sent both ways (`eval/accuracy_by_bits`) and, when the
run models devices or links (`board.models_clock`), against simulated
milliseconds (`eval/accuracy_by_simulated_ms`). Own tags, not the same tag in
sub-runs: a chart has one x unit, and each variant stays one run.

On resume the event files (and events.log) first lose what was logged after
the checkpoint (`rewind.rewind_logs`), before the writer opens a new one.
"""

from __future__ import annotations

from fedsim.experiment.callbacks.callback import Callback
from fedsim.experiment.callbacks.closing import close_quietly
from fedsim.experiment.round_result import RoundResult
from fedsim.experiment.run_state import Run
from fedsim.metric_names import (EVAL_ACCURACY, EVAL_ACCURACY_BY_BITS,
                                 EVAL_ACCURACY_BY_SIMULATED_MS, SIMULATED_SECONDS, bits_sent)
from fedsim.reporting import TensorBoardSink
from fedsim.reporting.board import models_clock
from fedsim.state.rewind import rewind_logs


class TensorBoard(Callback):

  def __init__(self):
    self._sink = None
    self._time_step = -1
    self._clock = False   # the run models devices or links

  def on_start(self, run: Run) -> None:
    if run.resume_from is not None:
      rewind_logs(run.run_dir, run.resume_from)
    self._sink = TensorBoardSink(run.run_dir)
    self._clock = models_clock(run.plain_config)
    for row in run.history:
      if EVAL_ACCURACY in row:
        self._time_step = _time_step(row[SIMULATED_SECONDS], self._time_step)

  def after_round(self, run: Run, record: RoundResult) -> None:
    metrics = record.metrics
    self._sink.write(run.round_num, metrics)
    if EVAL_ACCURACY in metrics:
      accuracy = metrics[EVAL_ACCURACY]
      if self._clock:
        self._time_step = _time_step(run.simulated_seconds, self._time_step)
        self._sink.write(self._time_step, {EVAL_ACCURACY_BY_SIMULATED_MS: accuracy})
      self._sink.write(int(bits_sent(metrics)), {EVAL_ACCURACY_BY_BITS: accuracy})

  def on_end(self, run: Run) -> None:
    self._sink.close()

  def on_error(self, run: Run, error: BaseException) -> None:
    close_quietly(self._sink)


def _time_step(simulated_seconds: float, previous: int) -> int:
  """The step of `eval/accuracy_by_simulated_ms`: simulated milliseconds.

  An evaluation after rounds that took no simulated time (every sampled
  client failed, no deadline) goes 1 ms after the previous one, so each
  evaluation keeps its own point (TensorBoard keeps one value per step).
  """
  return max(round(simulated_seconds * 1000), previous + 1)
