"""How `fedsim run` ends on Ctrl-C (SIGINT) and SIGTERM: cleanly, and always soon.

* The first SIGINT raises KeyboardInterrupt and SIGTERM raises SystemExit(143)
  in the main thread, so the run writes `status: interrupted`, its session
  kills the worker and the CLI exits 130 / 143, as on any other exit. If the
  main thread is inside TensorFlow, the exception waits until TensorFlow
  returns to its caller (TensorFlow's C code would turn it into a TypeError);
  inside an import, until the import is done (one cut short in a C
  extension's initialization fails as an ImportError and may leave the
  interpreter unable to shut down).
* Either signal also arms a deadline: a process still alive
  `EXIT_DEADLINE_S` later (a call on the way out blocked, or the main thread
  sits in a C call that never returns to Python) runs the forced-exit hooks,
  SIGKILLs its workers and leaves with `os._exit`.
* A second SIGINT leaves that way at once. One that follows the first within
  `SAME_INTERRUPT_S` is the same Ctrl-C delivered twice: `uv run` forwards a
  terminal's SIGINT to fedsim, which the terminal signalled too (its whole
  process group); it is ignored, so one Ctrl-C still ends the run cleanly.
* The forced exit says how to continue (`set_resume_hint`), as the clean one does.
* Once fedsim's own cleanup is done, the CLI leaves a signalled process with
  `exit_now_if_signalled`, skipping Python's teardown.
* Once the program's work is done and reported (`work_done`), a signal no
  longer raises: the exit is under way, and an exception raised then (at the
  top level, in an atexit callback) would only print a traceback. The process
  ends with the work's exit code after the atexit callbacks, skipping Python's
  teardown: there TensorFlow's destructors run (a KeyboardInterrupt raised
  then aborted the process once) and the default signal handlers come back (a
  Ctrl-C after that killed it: exit -2). The deadline and a second Ctrl-C
  still end an exit that hangs.
* At exit, TFF's own default context is dropped while Python's modules are
  still intact (see `fedsim.backend.contexts.drop_default`).
* Once a signal started the exit, what TFF raises in finalizers and other
  unraisable places is dropped: fedsim kills the worker on purpose, and the
  remote values freed while the stack unwinds then fail to dispose of
  themselves on it ('Exception ignored in: <finalize object>' and a gRPC
  'Connection reset by peer' traceback, 1 in ~25 trials under load).

The deadline and the second Ctrl-C are seen by a watcher thread reading
Python's signal wakeup fd: Python runs signal handlers only in the main
thread and only between bytecodes, which a main thread stuck in C never
reaches. Imports no TensorFlow, so the CLI installs this before anything slow.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
import threading
import time
import weakref
from typing import Callable, Iterator

EXIT_DEADLINE_S = 8.0
# uv's forwarded copy of a terminal's Ctrl-C arrives within milliseconds, but
# the watcher thread may read the two only hundreds of ms apart on a loaded
# machine; a person who wants out at once presses again after that.
SAME_INTERRUPT_S = 1.0
# What `fedsim run` imports at start-up, for seconds (see `_importing`).
_STARTUP_PACKAGES = ("tensorflow", "tensorflow_federated", "jax", "keras")
_HOOK_TIMEOUT_S = 1.0
_FINALIZE_CALL = weakref.finalize.__call__.__code__
# The file names of the frames of Python's import system (its frozen bootstrap).
_IMPORT_MACHINERY = "<frozen importlib._bootstrap"

_lock = threading.RLock()  # A signal handler may run while the main thread holds it.
_installed = False
_interrupted = False      # the Python SIGINT handler has raised its KeyboardInterrupt
_resume_hint = ""
_stderr_fd: int | None = None  # fd 2 as it was when the handlers were installed
_signalled = False        # a SIGINT or SIGTERM has started this exit
_work_done = False        # `work_done`: signals from here on are not raised
_exit_code = 0            # the code `work_done` was given
_deadline: threading.Timer | None = None
_exiting = threading.Lock()
_hooks: list[Callable[[], None]] = []


def install_exit_handlers() -> None:
  """Installs the behaviour of the module docstring for this process.

  Does nothing outside the main thread, where Python cannot set handlers,
  and nothing the second time. Replaces Python's signal wakeup fd, which an
  asyncio loop running in the main thread would also use (not the CLI's case).
  """
  global _installed, _stderr_fd
  if threading.current_thread() is not threading.main_thread():
    return
  with _lock:
    if _installed:
      return
    try:
      _stderr_fd = os.dup(2)
    except OSError:
      _stderr_fd = None  # no stderr to write to
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.unraisablehook = _quiet_tff_teardown(sys.unraisablehook)
    threading.Thread(target=_watch, args=(read_fd,), name="fedsim-signals",
                     daemon=True).start()
    atexit.register(_leave_after_exit_callbacks)  # first registered: runs last
    atexit.register(_drop_tff_default)
    _installed = True


@contextlib.contextmanager
def forced_exit_hook(hook: Callable[[], None]) -> Iterator[None]:
  """Runs `hook()` if the process is forced to exit during the `with` body.

  Hooks run on a helper thread for at most 1 s in all; they should be quick
  and must not need the main thread (e.g. mark a run directory interrupted).
  """
  with _lock:
    _hooks.append(hook)
  try:
    yield
  finally:
    with _lock:
      _hooks.remove(hook)


def exit_now_if_signalled(code: int) -> None:
  """Ends the process with `code` at once if a SIGINT / SIGTERM started this exit.

  Call it once the run's own cleanup is done (status written, worker
  stopped). Python's teardown would then spend seconds in TensorFlow's
  destructors, and aborts the process ('FATAL: exception not rethrown') when
  a TFF thread is still inside TensorFlow's C++ with a computation that the
  interrupt cut short. Returns (doing nothing) if no signal was received.
  """
  if not _signalled:
    return
  worker = sys.modules.get("fedsim.runtime.worker_binary")
  if worker is not None:
    worker.shutdown()  # Bounded; normally nothing is left by now.
  _flush_and_exit(code)


def work_done(code: int) -> None:
  """The program's work is done and reported, and it exits with `code`: from
  here on SIGINT and SIGTERM do not raise, and the process ends with `code`
  once the atexit callbacks ran (see the module docstring). Does nothing to
  a process without the handlers."""
  global _work_done, _exit_code
  _exit_code = code
  _work_done = True


def _leave_after_exit_callbacks() -> None:
  """The last atexit callback (registered first): ends a process whose work is
  done without Python's teardown."""
  if _work_done:
    _flush_and_exit(_exit_code)


def _flush_and_exit(code: int) -> None:
  """Flushes Python's stdout and stderr, then `os._exit(code)`: no teardown."""
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError, AttributeError):  # closed, or replaced by None
      pass
  os._exit(code)  # pylint: disable=protected-access


def set_resume_hint(hint: str) -> None:
  """What a forced exit adds to its line, e.g. 'resume with: fedsim run --resume DIR'."""
  global _resume_hint
  _resume_hint = hint


def _on_sigint(signum, frame) -> None:
  """Raises the first SIGINT's KeyboardInterrupt; later ones are the watcher's.

  Whether a later SIGINT is a second Ctrl-C or the first one's copy is decided
  by when it arrived, which only the watcher sees: this handler runs when the
  main thread next reaches a bytecode, after a C call that may take seconds
  (e.g. Ray's wait for cancelled tasks), so uv's copy sent 10 ms after the
  first looked like a second Ctrl-C here.
  """
  del signum
  global _interrupted, _signalled
  _signalled = True
  if _interrupted or _work_done:
    return  # the first one's KeyboardInterrupt is on its way, or nothing is left to stop
  _interrupted = True
  _raise_outside_tensorflow(frame, KeyboardInterrupt())


def _on_sigterm(signum, frame) -> None:
  global _signalled
  _signalled = True
  if _work_done:
    return
  _raise_outside_tensorflow(frame, SystemExit(128 + signum))


def _raise_outside_tensorflow(frame, error: BaseException) -> None:
  """Raises `error` now, or, if the main thread is inside TensorFlow (or
  another place `_guarded_caller` names, such as an import), in the frame
  that called it as soon as that call returns to it.

  TensorFlow's C code calls back into Python (it reads the eager context's
  `_handle` property for each tensor it makes) and replaces an exception
  raised there by its own TypeError ('Expected `context` argument in
  EagerTensor constructor to have a `_handle` attribute ... Was eager Context
  initialized?'): a Ctrl-C handled at that moment failed the run with a
  traceback. The caller's local trace function raises `error` at the
  caller's next event (its next line, or its return), as a debugger stops a
  frame. Under a debugger or coverage tool, which owns tracing, it is raised
  at once.
  """
  caller = _guarded_caller(frame)
  if caller is None or sys.gettrace() is not None or _importing(frame):
    raise error

  def raise_in_caller(traced, event, arg):
    del event, arg
    sys.settrace(None)
    traced.f_trace = None
    raise error

  caller.f_trace = raise_in_caller
  sys.settrace(_trace_no_calls)  # Tracing on for this thread; frames TF still runs untraced.


def _trace_no_calls(frame, event, arg) -> None:
  del frame, event, arg
  return None


def _importing(frame) -> bool:
  """Whether `frame` runs inside the import of TensorFlow (or TFF, JAX): start-up.

  Waiting for the import to return would take longer than the exit deadline
  (20-40 s on a loaded machine), and the import is being abandoned anyway:
  the interrupt is raised at once. Not inside a garbage-collector callback or
  a finalizer, where Python would drop it (see `_guarded_caller`).
  """
  callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks} - {None}
  loading = False
  while frame is not None:
    code = frame.f_code
    if code in callbacks or _finalizing(code):
      return False
    if code.co_name == "<module>" and any(f"{os.sep}{package}{os.sep}" in code.co_filename
                                          for package in _STARTUP_PACKAGES):
      loading = True
    frame = frame.f_back
  return loading


def _finalizing(code) -> bool:
  """Whether `code` is a finalizer's: an object's `__del__` or `weakref.finalize`'s call."""
  return code.co_name == "__del__" or code is _FINALIZE_CALL


def _guarded_caller(frame):
  """The frame that called the outermost guarded frame of `frame`'s stack (None
  if none is on it). Guarded: TensorFlow's own frames, a garbage collector
  callback's (e.g. JAX's `_xla_gc_callback`) and a finalizer's (`__del__`,
  e.g. asyncio's event loop's as TFF drops its loops, or a `weakref.finalize`
  callback, as TFF's remote values dispose of themselves): Python reports an
  exception raised in either as 'Exception ignored in ...' and goes on, so a
  Ctrl-C handled there was lost (in a gc callback 1 of 20 trials under load;
  in a finalizer once in a full test run, where a study then ran to its end
  and exited 0). And the import machinery's frames: a module is imported
  whole. A Ctrl-C handled while matplotlib's `ft2font` extension initialized
  (pybind11 calls Python's `enum` from C) became 'ImportError: initialization
  failed', so a run interrupted as it drew its board failed with a traceback,
  and the interpreter aborted in its teardown (CI, once)."""
  tf = sys.modules.get("tensorflow")
  root = os.path.dirname(getattr(tf, "__file__", None) or "")
  prefix = root + os.sep if root else None
  callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks} - {None}
  caller, inside = None, False
  while frame is not None:
    if ((prefix is not None and frame.f_code.co_filename.startswith(prefix))
        or frame.f_code.co_filename.startswith(_IMPORT_MACHINERY)
        or frame.f_code in callbacks or _finalizing(frame.f_code)):
      inside, caller = True, None
    elif inside and caller is None:
      caller = frame
    frame = frame.f_back
  return caller


def _watch(read_fd: int) -> None:
  first_interrupt_at = None
  while True:
    try:
      received = os.read(read_fd, 64)
    except InterruptedError:
      continue
    now = time.monotonic()
    for signum in received:
      if signum == signal.SIGINT:
        if first_interrupt_at is None:
          first_interrupt_at = now
        elif now - first_interrupt_at > SAME_INTERRUPT_S:
          force_exit(130, "interrupted again; exiting now")
      if signum in (signal.SIGINT, signal.SIGTERM):
        _arm_deadline(128 + signum)


def _arm_deadline(code: int) -> None:
  global _deadline
  with _lock:
    if _deadline is not None:
      return
    _deadline = threading.Timer(
        EXIT_DEADLINE_S, force_exit,
        (code, f"still shutting down after {EXIT_DEADLINE_S:.0f} s; exiting now"))
    _deadline.daemon = True
    _deadline.start()


def force_exit(code: int, why: str) -> None:
  """Runs the hooks, SIGKILLs owned workers, says `why` on fd 2, `os._exit(code)`.

  Never returns; a second caller while the first is exiting waits for it.
  """
  _exiting.acquire()  # Held until the process is gone.
  with _lock:
    hooks = list(_hooks)
  runner = threading.Thread(target=_run_hooks, args=(hooks,), daemon=True)
  runner.start()
  runner.join(_HOOK_TIMEOUT_S)
  worker = sys.modules.get("fedsim.runtime.worker_binary")  # Loaded only if a worker may exist.
  if worker is not None:
    worker.kill_all()
  try:
    # The terminal's stderr: fd 2 may be held back by a filter at this moment
    # (fedsim.backend.quiet), whose replay a forced exit never reaches.
    os.write(_stderr_fd if _stderr_fd is not None else 2,
             f"fedsim: {why}{'; ' + _resume_hint if _resume_hint else ''}\n".encode())
  except OSError:
    pass
  os._exit(code)  # pylint: disable=protected-access


def _drop_tff_default() -> None:
  if "tensorflow_federated" in sys.modules:  # Else nothing to drop, and no import now.
    from fedsim.backend import contexts  # pylint: disable=g-import-not-at-top
    contexts.drop_default()


def _quiet_tff_teardown(report: Callable[..., None]) -> Callable[..., None]:
  """An unraisable hook: drops TFF's after a signal, passes the rest to `report`."""
  def hook(unraisable) -> None:
    if _signalled and _raised_in_tff(unraisable.exc_traceback):
      return
    report(unraisable)
  return hook


def _raised_in_tff(traceback) -> bool:
  while traceback is not None:
    if f"{os.sep}tensorflow_federated{os.sep}" in traceback.tb_frame.f_code.co_filename:
      return True
    traceback = traceback.tb_next
  return False


def _run_hooks(hooks: list[Callable[[], None]]) -> None:
  for hook in hooks:
    try:
      hook()
    except BaseException:  # pylint: disable=broad-except
      pass  # Best effort: the process is leaving either way.
