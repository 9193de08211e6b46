"""The user's `on_round(round, metrics, info)`, after the round is logged and its checkpoint is on disk."""

from __future__ import annotations

from typing import Callable

from fedsim.experiment.callbacks.callback import Callback
from fedsim.experiment.round_info import RoundInfo
from fedsim.experiment.round_result import RoundResult
from fedsim.experiment.run_state import Run


class OnRound(Callback):
  """Calls `on_round(round, metrics, info)`, `info` a RoundInfo."""

  def __init__(self, on_round: Callable[[int, dict[str, float], RoundInfo], None]):
    self._on_round = on_round

  def after_round(self, run: Run, record: RoundResult) -> None:
    self._on_round(run.round_num, record.metrics,
                   RoundInfo(run.trained_weights(), record.sampled, record.aggregated,
                             record.staleness))
