"""Which fedsim-owned worker runs TFF computations: a run's session, or the guard.

`session` starts a worker for the `with` body, installs a TFF context on it
for the calling thread and, on any exit, restores whatever context was there
before (TFF's own default, the guard, an enclosing session) and stops the
worker. A run executes inside one session.

The guard is opt-in (`install_guard`): it makes a fedsim-owned worker, started
on demand, the calling thread's default context, so computations called
outside any session (a test, a notebook cell) never start TFF's own worker,
which outlives its parent. Importing fedsim changes no TFF context.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from typing import Iterator

from fedsim.backend import contexts
from fedsim.runtime.worker_binary import Worker

# A context's event-loop thread is asked to stop; it ends within milliseconds
# unless a call is stuck, and then is left (it is a daemon thread).
_RETIRE_TIMEOUT_S = 2.0

_guard_lock = threading.Lock()
_guard: Worker | None = None
_guard_context = None


def _guard_stub():
  global _guard
  with _guard_lock:
    if _guard is None or not _guard.alive:
      if _guard is not None:
        _guard.stop()
      _guard = Worker(os.path.join(tempfile.gettempdir(),
                                   f"fedsim-worker-{os.getpid()}.log")).start()
    return _guard.stub


def install_guard() -> None:
  """Runs this thread's computations outside sessions on a fedsim-owned worker.

  Replaces TFF's default context in the calling thread (TFF's context stack is
  per thread) with one whose worker is started at the first call, logs to
  `tempfile.gettempdir()/fedsim-worker-<pid>.log`, dies with this process
  and is replaced if it dies. Call it before any computation runs on TFF's
  own context: a worker TFF has already started cannot be taken back.
  Calling it again is harmless.
  """
  global _guard_context
  with _guard_lock:
    if _guard_context is None:
      _guard_context = contexts.remote_context(_guard_stub)
  contexts.set_default(_guard_context)


@contextlib.contextmanager
def session(log_path: str, max_concurrent_computation_calls: int = -1) -> Iterator[Worker]:
  """Runs the TFF computations of the `with` body (in this thread) on a fresh worker.

  Yields the started Worker. On any exit the worker is stopped (bounded, see
  `Worker.stop`) and the context that ran computations before comes back.

  Raises:
    RunFailed: the worker could not be started (see `Worker.start`), or a
      computation found it dead.
  """
  worker = Worker(log_path, max_concurrent_computation_calls).start()

  def stub():
    # TFF retries UNAVAILABLE forever, rebuilding the executor each time: a
    # dead worker must end the call instead of hanging the run.
    worker.check_alive("a TFF computation")
    return worker.stub

  context = None
  finished = False
  try:
    context = contexts.remote_context(stub)
    with contexts.installed(context):
      yield worker
    finished = True
  finally:
    worker.stop()
    # After an exception a call may still be in flight on the context's loop
    # (it ends with the dead worker); its daemon thread is left to it.
    if finished:
      contexts.retire(context, _RETIRE_TIMEOUT_S)
