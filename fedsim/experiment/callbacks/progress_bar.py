"""The terminal progress bar (see `fedsim.reporting.Progress`)."""

from __future__ import annotations

from fedsim.experiment.callbacks.callback import Callback
from fedsim.experiment.round_result import RoundResult
from fedsim.experiment.run_state import Run
from fedsim.reporting import Progress


class ProgressBar(Callback):
  """`enabled`: True/False to force; None shows the bar only on a terminal."""

  def __init__(self, enabled: bool | None):
    self._enabled = enabled
    self._bar = None

  def on_start(self, run: Run) -> None:
    self._bar = Progress(run.sim.config.rounds, enabled=self._enabled, start_round=run.start)

  def after_round(self, run: Run, record: RoundResult) -> None:
    self._bar.update(run.round_num, record.metrics)

  def on_end(self, run: Run) -> None:
    self._bar.close()

  def on_error(self, run: Run, error: BaseException) -> None:
    if self._bar is not None:
      self._bar.close()
