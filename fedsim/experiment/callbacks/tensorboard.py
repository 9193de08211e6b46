"""TensorBoard scalars: every metric by round in the run directory, and eval
accuracy by simulated time (`simulated_time/`) and by bits sent (`by_bits/`).

On resume the event files (and events.log) first lose what was logged after
the checkpoint (`rewind.rewind_logs`), before the writers open new ones.
"""

from __future__ import annotations

from fedsim.experiment.callbacks.base import Callback
from fedsim.experiment.callbacks.closing import close_quietly
from fedsim.experiment.rewind import BITS_DIR, TIME_DIR, rewind_logs
from fedsim.experiment.round_result import RoundResult
from fedsim.experiment.run_state import Run
from fedsim.metric_names import EVAL_ACCURACY, SIMULATED_SECONDS, bits_sent
from fedsim.reporting import TensorBoardSink


class TensorBoard(Callback):

  def __init__(self):
    self._rounds = self._time = self._bits = None
    self._time_step = -1

  def on_start(self, run: Run) -> None:
    if run.resume_from is not None:
      rewind_logs(run.run_dir, run.resume_from)
    self._rounds = TensorBoardSink(run.run_dir)
    # Eval accuracy against cumulative simulated milliseconds (TensorBoard's step axis).
    self._time = TensorBoardSink(run.run_dir / TIME_DIR)
    # And against cumulative bits sent both ways (the accuracy-vs-bits plot).
    self._bits = TensorBoardSink(run.run_dir / BITS_DIR)
    for row in run.history:
      if EVAL_ACCURACY in row:
        self._time_step = _time_step(row[SIMULATED_SECONDS], self._time_step)

  def after_round(self, run: Run, record: RoundResult) -> None:
    metrics = record.metrics
    if EVAL_ACCURACY in metrics:
      self._time_step = _time_step(run.simulated_seconds, self._time_step)
      self._time.write(self._time_step, {EVAL_ACCURACY: metrics[EVAL_ACCURACY]})
      self._bits.write(int(bits_sent(metrics)), {EVAL_ACCURACY: metrics[EVAL_ACCURACY]})
    self._rounds.write(run.round_num, metrics)

  def on_end(self, run: Run) -> None:
    for sink in (self._rounds, self._time, self._bits):
      sink.close()

  def on_error(self, run: Run, error: BaseException) -> None:
    close_quietly(self._rounds, self._time, self._bits)


def _time_step(simulated_seconds: float, previous: int) -> int:
  """The `simulated_time` step of an evaluation: simulated milliseconds.

  An evaluation after rounds that took no simulated time (every sampled
  client failed, no deadline) goes 1 ms after the previous one, so each
  evaluation keeps its own point (TensorBoard keeps one value per step).
  """
  return max(round(simulated_seconds * 1000), previous + 1)
