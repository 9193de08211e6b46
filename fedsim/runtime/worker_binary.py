"""The TFF runtime process, `worker_binary`, owned and reaped by fedsim.

TFF 0.87 runs computations in a child process, `worker_binary`, over gRPC.
TFF's own default context starts it with the caller's stdout/stderr and never
kills it at exit, so it outlives its parent and holds the parent's pipes open.
fedsim starts each worker itself: stdin /dev/null, output to a log file,
SIGKILL from the kernel when fedsim's process dies (PR_SET_PDEATHSIG), kill
and reap by `Worker.stop`, and by `shutdown` at exit.

Every call on the way out is bounded: a worker that will not be reaped, or a
gRPC channel whose close blocks (seen once: 30 minutes in `Channel.close`
after Ctrl-C), delays an exit by seconds at most. Which computations run on a
worker is decided elsewhere (`fedsim.runtime.session`).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from typing import Any, Callable

# Before gRPC initialises: with fork support on, every worker start prints
# "Other threads are currently calling into gRPC, skipping fork() handlers" on
# fedsim's stderr; the worker execs at once and never needs the handlers.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # pylint: disable=g-import-not-at-top,wrong-import-position

from fedsim.backend import contexts  # pylint: disable=g-import-not-at-top
from fedsim.errors import RunFailed  # pylint: disable=g-import-not-at-top

_START_TIMEOUT_S = 60.0
# SIGKILL cannot be ignored, but a process in uninterruptible sleep (a stuck
# disk) is reaped only once it wakes; the kernel finishes it without us.
_REAP_TIMEOUT_S = 5.0
_CLOSE_TIMEOUT_S = 2.0
_POLL_S = 0.02
# As in TFF: model weights and whole client datasets travel in one message.
_CHANNEL_OPTIONS = [(f"grpc.{name}", 2 * 1000 * 1000 * 1000) for name in (
    "max_message_length", "max_receive_message_length", "max_send_message_length")]
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl

_owned: set[Worker] = set()
_owned_lock = threading.Lock()

# PR_SET_PDEATHSIG fires when the *thread* that forked the child exits. TFF
# calls the executor stack function (where a guard starts its worker) on a
# per-context event-loop thread and a session may be opened from any thread,
# and the main thread cannot be made to run code on demand; so every fork
# happens on one daemon thread of fedsim's that lives as long as the process.
_fork_lock = threading.Lock()
_fork_jobs: queue.SimpleQueue = queue.SimpleQueue()
_fork_thread_pid = -1


def _on_fork_thread(fn: Callable[[], Any]) -> Any:
  """Returns `fn()` run on the fork thread; re-raises what it raises."""
  global _fork_jobs, _fork_thread_pid
  with _fork_lock:
    if _fork_thread_pid != os.getpid():  # Not started yet, or we are an os.fork() child.
      _fork_jobs = queue.SimpleQueue()
      threading.Thread(target=_serve_forks, args=(_fork_jobs,), name="fedsim-fork",
                       daemon=True).start()
      _fork_thread_pid = os.getpid()
    jobs = _fork_jobs
  future = concurrent.futures.Future()
  jobs.put((fn, future))
  return future.result()


def _serve_forks(jobs: queue.SimpleQueue) -> None:
  while True:
    fn, future = jobs.get()
    try:
      future.set_result(fn())
    except BaseException as e:  # pylint: disable=broad-except
      future.set_exception(e)


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
  def preexec() -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # The parent died before prctl took hold.
      os.kill(os.getpid(), signal.SIGKILL)
  return preexec


def _reserve_port() -> socket.socket:
  """A bound, non-listening socket on the port the worker will listen on.

  The worker binds with SO_REUSEPORT, so it would silently share a port that
  another worker picked too; holding this socket (also SO_REUSEPORT) while the
  worker lives keeps the port out of other free-port searches.
  """
  try:
    sock, host = socket.socket(socket.AF_INET6, socket.SOCK_STREAM), "::"
  except OSError:  # No IPv6: the worker listens on IPv4 only.
    sock, host = socket.socket(socket.AF_INET, socket.SOCK_STREAM), "0.0.0.0"
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
  sock.bind((host, 0))
  return sock


def _close_bounded(channel: grpc.Channel, timeout_s: float) -> bool:
  """Closes `channel` on a daemon thread; True if it closed within `timeout_s`.

  A close that blocks (gRPC waiting on a call that an interrupt cut short)
  is left to finish, or not, on its own thread; the process may still exit.
  """
  closer = threading.Thread(target=channel.close, name="fedsim-channel-close", daemon=True)
  closer.start()
  closer.join(timeout_s)
  return not closer.is_alive()


class Worker:
  """One `worker_binary` child process owned by this process.

  `log_path` receives the worker's stdout and stderr (appended);
  `max_concurrent_computation_calls` <= 0 means no limit; `binary` replaces
  TFF's bundled executable (tests use it to make a worker that fails).
  """

  def __init__(self, log_path: str, max_concurrent_computation_calls: int = -1,
               *, binary: str | None = None):
    self.log_path = str(log_path)
    self._args = [binary or contexts.worker_binary(),
                  f"--max_concurrent_computation_calls={int(max_concurrent_computation_calls)}"]
    self._process: subprocess.Popen | None = None
    self._owner_pid = os.getpid()
    self._port_socket: socket.socket | None = None
    self._channel: grpc.Channel | None = None
    self.stub = None  # A TFF executor stub (`contexts.grpc_stub`) once started.

  @property
  def pid(self) -> int | None:
    """The worker's process id (kept after it stops), or None before start."""
    return self._process.pid if self._process else None

  @property
  def alive(self) -> bool:
    return self._process is not None and self._process.poll() is None

  def start(self) -> Worker:
    """Starts the worker and returns self once its gRPC service answers.

    Raises:
      RunFailed: the worker could not be started, exited while starting, or
        did not answer within 60 s; the message names the log file.
    """
    if self._process is not None:
      raise RuntimeError("a Worker can be started only once")
    self._port_socket = _reserve_port()
    port = self._port_socket.getsockname()[1]
    args = self._args + [f"--port={port}"]
    with open(self.log_path, "ab") as log:
      log.write(f"--- fedsim: {' '.join(args)}\n".encode())
      log.flush()  # Before the worker appends to the same file.
      try:
        self._process = _on_fork_thread(lambda: subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent(os.getpid()),
            # Its own process group: Ctrl-C in a terminal reaches fedsim, which
            # then stops the worker, instead of killing the worker mid-call.
            process_group=0))
      except OSError as e:
        self._port_socket.close()
        raise RunFailed(f"cannot start TFF worker {args[0]}: {e}") from None
    with _owned_lock:
      _owned.add(self)
    try:
      deadline = time.monotonic() + _START_TIMEOUT_S
      # A plain TCP probe first: after a refused connection gRPC backs off
      # for a second or more, longer than the worker takes to listen.
      while not _accepts(port):
        self._check_starting(deadline)
      self._channel = grpc.insecure_channel(f"localhost:{port}", _CHANNEL_OPTIONS)
      self.stub = contexts.grpc_stub(self._channel)
      while not self.stub.is_ready:
        self._check_starting(deadline)
    except BaseException:
      self.stop()
      raise
    return self

  def _check_starting(self, deadline: float) -> None:
    time.sleep(_POLL_S)
    code = self._process.poll()
    if code is not None:
      raise RunFailed(f"TFF worker process (pid {self.pid}) exited with code {code}"
                      f" while starting; see {self.log_path}")
    if time.monotonic() > deadline:
      raise RunFailed(f"TFF worker process (pid {self.pid}) did not answer within"
                      f" {_START_TIMEOUT_S:.0f} s; see {self.log_path}")

  def kill(self) -> None:
    """Sends SIGKILL to a live worker and returns at once (no reaping, no locks)."""
    # SIGKILL, not a polite signal: the worker holds no state worth saving.
    # A process forked from the owner must leave the owner's worker alone.
    process = self._process
    if process is not None and self._owner_pid == os.getpid() and process.returncode is None:
      try:
        process.send_signal(signal.SIGKILL)
      except OSError:  # Already reaped by another thread.
        pass

  def stop(self, *, close_channel: bool = True) -> None:
    """Kills and reaps the worker; safe to call again or before `start`.

    Takes at most ~7 s whatever happens: the reap waits 5 s, the channel
    close 2 s (each on its own; what has not finished by then is left).

    Args:
      close_channel: False at interpreter exit, where the socket dies with
        the process and a gRPC close has nothing left to save.
    """
    self.kill()
    if self._process is not None and self._owner_pid == os.getpid():
      try:
        self._process.wait(timeout=_REAP_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        pass  # Killed, not yet reaped; PDEATHSIG is moot, nothing else to do.
    channel, self._channel = self._channel, None
    if channel is not None and close_channel:
      _close_bounded(channel, _CLOSE_TIMEOUT_S)
    if self._port_socket is not None:
      self._port_socket.close()
      self._port_socket = None
    with _owned_lock:
      _owned.discard(self)

  def check_alive(self, during: str) -> None:
    """Raises RunFailed if the worker has died.

    Args:
      during: what was running, e.g. "round 3"; it completes the message
        "TFF worker process (pid N) died during round 3; see LOG".
    """
    if self._process is None:
      raise RuntimeError("check_alive() on a Worker that was never started")
    if not self.alive:
      raise RunFailed(f"TFF worker process (pid {self.pid}) died during {during};"
                      f" see {self.log_path}")


def _accepts(port: int) -> bool:
  try:
    socket.create_connection(("localhost", port), timeout=1.0).close()
  except OSError:
    return False
  return True


def owned_workers() -> list[Worker]:
  """The workers this process started and has not stopped yet."""
  # Bounded: called from forced exits, where a lock holder may never return.
  if not _owned_lock.acquire(timeout=1.0):
    return list(_owned)
  try:
    return list(_owned)
  finally:
    _owned_lock.release()


def kill_all() -> None:
  """SIGKILLs every owned worker without waiting (for `os._exit` paths)."""
  for worker in owned_workers():
    worker.kill()


def shutdown() -> None:
  """Stops every worker this process started; registered to run at exit.

  Channels are not closed: the process is going away, and a close is the
  call that once blocked an exit for 30 minutes.
  """
  for worker in owned_workers():
    worker.stop(close_channel=False)


atexit.register(shutdown)
