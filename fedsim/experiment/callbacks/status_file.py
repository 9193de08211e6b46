"""The run's `status` file: running, then completed, failed or interrupted (and why)."""

from __future__ import annotations

import pathlib
from typing import Callable

from fedsim.errors import RunFailed, host_error
from fedsim.experiment.callbacks.callback import Callback
from fedsim.experiment.run_state import Run
from fedsim.reporting import write_status


class Status(Callback):
  """Writes 'running' first and 'completed' last (with who stopped the run, if
  a callback did); on an error, what it means.

  `check_runtime(during)` raises RunFailed if the runtime died; it is asked
  when the run fails, so a dead worker is reported as such.
  """

  def __init__(self, check_runtime: Callable[[str], None] | None = None):
    self._check_runtime = check_runtime

  def on_start(self, run: Run) -> None:
    write_status(run.run_dir, "running")

  def on_end(self, run: Run) -> None:
    write_status(run.run_dir, "completed", "" if run.stopped_by is None else (
        f"stopped after round {run.round_num} of {run.sim.config.rounds} by {run.stopped_by}"))

  def on_error(self, run: Run, error: BaseException) -> BaseException:
    during = f"round {run.round_num}" if run.round_num > run.start else "start-up"
    return record_ending(error, run.run_dir, self._check_runtime, during)


def record_ending(error: BaseException, run_dir: pathlib.Path,
                  check_runtime: Callable[[str], None] | None, during: str) -> BaseException:
  """Writes the status of a run that `error` ended; returns what to raise.

  That is `error` itself, or what it means: a HostError for a file that could
  not be written, a RunFailed naming the dead runtime if `check_runtime`
  finds it dead.
  """
  raised = error
  if isinstance(error, (KeyboardInterrupt, SystemExit)):
    status = "interrupted"
  else:
    status = "failed"
    os_error = _os_error_of(error)
    if os_error is not None:
      raised = host_error(os_error, run_dir)
    elif check_runtime is not None:
      try:
        check_runtime(during)
      except RunFailed as dead:
        raised = dead
  message = "" if status == "interrupted" else (
      str(raised).splitlines()[0] if str(raised) else type(raised).__name__)
  try:
    write_status(run_dir, status, message)
  except OSError:
    pass  # Even the in-place rewrite failed; the raised error still says why.
  return raised


def _os_error_of(error: BaseException) -> OSError | None:
  """The OSError behind `error`: itself, or what a RunFailed was raised for."""
  if isinstance(error, OSError):
    return error
  if isinstance(error, RunFailed) and isinstance(error.__context__, OSError):
    return error.__context__  # e.g. export_model's 'cannot write P'
  return None
