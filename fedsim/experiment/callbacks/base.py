"""The hooks a run loop callback may implement, and the list that calls them.

After pfl-research's `TrainingProcessCallback`: the loop only plays rounds;
whatever is written or shown (status, logs, checkpoints, progress, the user's
`on_round`) is a callback. `on_start` and `after_round` run in the list's
order, `on_end` and `on_error` in reverse, as nested `with` blocks unwind: a
callback that opens something in `on_start` sees the ones before it opened
and is closed before them.
"""

from __future__ import annotations

from typing import Sequence

from fedsim.experiment.round_result import RoundResult
from fedsim.experiment.run_state import Run


class Callback:
  """A run loop callback; every hook does nothing unless overridden."""

  def on_start(self, run: Run) -> None:
    """Before the run's state is built (`run.start`, `run.resume_from` are known)."""

  def after_round(self, run: Run, record: RoundResult) -> None:
    """After round `run.round_num` was played; `record.metrics` may be extended."""

  def on_end(self, run: Run) -> None:
    """After the last round."""

  def on_error(self, run: Run, error: BaseException) -> BaseException | None:
    """When `error` ends the run; returns what to raise instead, or None.

    Must not raise: whatever it fails at would hide `error`.
    """
    del run, error
    return None


class CallbackList(Callback):
  """Calls each hook of `callbacks` (see the module docstring for the order)."""

  def __init__(self, callbacks: Sequence[Callback]):
    self.callbacks = list(callbacks)

  def on_start(self, run: Run) -> None:
    for callback in self.callbacks:
      callback.on_start(run)

  def after_round(self, run: Run, record: RoundResult) -> None:
    for callback in self.callbacks:
      callback.after_round(run, record)

  def on_end(self, run: Run) -> None:
    for callback in reversed(self.callbacks):
      callback.on_end(run)

  def on_error(self, run: Run, error: BaseException) -> BaseException:
    """Tells every callback; returns the last replacement any of them gave, or `error`."""
    raised = error
    for callback in reversed(self.callbacks):
      raised = callback.on_error(run, error) or raised
    return raised
