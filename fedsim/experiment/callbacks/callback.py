"""The hooks a run loop callback may implement, and the list that calls them.

After pfl-research's `TrainingProcessCallback`: the loop only plays rounds;
whatever is written or shown (status, logs, checkpoints, progress, the user's
`on_round` and `callbacks=`) is a callback. `on_start` and `after_round` run
in the list's order, `on_end` and `on_error` in reverse, as nested `with`
blocks unwind: a callback that opens something in `on_start` sees the ones
before it opened and is closed before them.

A callback ends a run early by returning True from `after_round`: every
callback still sees that round, then the run ends as if it were the last
(`on_end`: the round is checkpointed, the model exported, the status reads
'completed' and says who stopped it).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Sequence

from fedsim.errors import RunFailed

if TYPE_CHECKING:  # `fedsim.Callback` is this module's: importing it imports no TensorFlow
  from fedsim.experiment.round_result import RoundResult
  from fedsim.experiment.run_state import Run


class Callback:
  """A run loop callback; every hook does nothing unless overridden.

  fedsim's own logging, checkpoints and progress bar are callbacks; so are
  those passed as `fedsim.run(..., callbacks=[...])` (subclass this one). A
  hook gets the `Run` in progress: `run.round_num`, `run.run_dir`,
  `run.sim.config` (the validated config), `run.history` (the metrics of
  every round logged so far, resumed ones included), `run.start` (rounds done
  before this process took the run over), `run.trained_weights()` (the global
  model's trainable weights as NumPy arrays).
  """

  @property
  def name(self) -> str:
    """How the run's status and errors name this callback: its class name."""
    return type(self).__name__

  def on_start(self, run: Run) -> None:
    """Before the run's state is built (`run.start`, `run.resume_from` are known)."""

  def after_round(self, run: Run, record: RoundResult) -> bool | None:
    """After round `run.round_num` was played; `record.metrics` may be extended.

    `record` also holds the round's `sampled` and `aggregated` client ids.
    Returns True to end the run after this round (None or False: go on).
    """

  def on_end(self, run: Run) -> None:
    """After the last round (`run.round_num`; earlier if a callback stopped the run)."""

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

  def after_round(self, run: Run, record: RoundResult) -> bool:
    """Calls every callback; returns True, and names the first that asked in
    `run.stopped_by`, if any asked to stop."""
    for callback in self.callbacks:
      if callback.after_round(run, record) and run.stopped_by is None:
        run.stopped_by = callback.name
    return run.stopped_by is not None

  def on_end(self, run: Run) -> None:
    for callback in reversed(self.callbacks):
      callback.on_end(run)

  def on_error(self, run: Run, error: BaseException) -> BaseException:
    """Tells every callback; returns the last replacement any of them gave, or `error`."""
    raised = error
    for callback in reversed(self.callbacks):
      raised = callback.on_error(run, error) or raised
    return raised


class UserCallback(Callback):
  """A callback the user passed, held to the contract the built-ins keep.

  An exception from its hooks fails the run as a RunFailed naming it in one
  line ('round 3: callback Name.after_round raised ValueError: ...'), chained
  to the original; KeyboardInterrupt and SystemExit pass as they are. What
  `after_round` returns must be True, False or None. Its `on_error` may not
  hide the run's error: what it raises is printed as a warning.
  """

  def __init__(self, callback: Callback, name: str | None = None):
    self._callback = callback
    self._name = name or callback.name

  @property
  def name(self) -> str:
    return self._name

  def on_start(self, run: Run) -> None:
    self._call("on_start", "start-up", run)

  def after_round(self, run: Run, record: RoundResult) -> bool:
    stop = self._call("after_round", f"round {run.round_num}", run, record)
    if stop is not None and not isinstance(stop, bool):
      raise RunFailed(f"round {run.round_num}: callback {self._name}.after_round returned"
                      f" {stop!r}; return True to stop the run, None or False to go on")
    return bool(stop)

  def on_end(self, run: Run) -> None:
    self._call("on_end", f"after round {run.round_num}", run)

  def on_error(self, run: Run, error: BaseException) -> BaseException | None:
    try:
      return self._callback.on_error(run, error)
    except Exception as e:  # pylint: disable=broad-except
      print(f"fedsim: warning: callback {self._name}.on_error raised"
            f" {_one_line(e)}", file=sys.stderr)
      return None

  def _call(self, hook: str, during: str, *args):
    try:
      return getattr(self._callback, hook)(*args)
    except Exception as e:  # pylint: disable=broad-except
      raise RunFailed(f"{during}: callback {self._name}.{hook} raised {_one_line(e)}") from e


def _one_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
