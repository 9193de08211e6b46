"""Who owns a run directory: the process writing it, and the lock that says so.

* A run's process holds an exclusive `fcntl.flock` on `<run>/.lock` from
  before it changes anything in the directory until the run ends. The kernel
  drops the lock when the process dies, however it dies, so a killed run
  cannot leave it stuck, and a second process is refused while it is held.
* The run's status file names the process that wrote it (`Writer`): its pid,
  host and start time (field 22 of /proc/<pid>/stat, in clock ticks since
  boot), so that a pid the system has since given to another process is not
  taken for the run's. A 'running' status whose writer is gone was left by a
  process that could not say why it ended (SIGKILL, out of memory, a reboot).

Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import pathlib
import re
import socket
import time

from fedsim.errors import UserError

LOCK_FILE = ".lock"
_WRITER = re.compile(r"writer: pid (\d+) on (\S+) started (\d+|\?)")


@dataclasses.dataclass(frozen=True)
class Writer:
  """A process, as a status or lock file names it.

  Attributes:
    pid: its process id.
    host: `socket.gethostname()` of its machine.
    start: its start time in clock ticks since boot (None where the system
      does not say: then a reused pid cannot be told apart).
  """

  pid: int
  host: str
  start: int | None

  def line(self) -> str:
    """'writer: pid P on HOST started T', as `parse_writer` reads it."""
    return f"writer: pid {self.pid} on {self.host} started {self.start or '?'}"

  def alive(self) -> bool | None:
    """Whether this process still runs; None if that cannot be told from here
    (another host, or no /proc)."""
    if self.host != socket.gethostname() or self.start is None:
      return None
    try:
      state, start = _proc_stat(self.pid)
    except FileNotFoundError:
      return False
    except OSError:
      return None
    # A zombie has ended: it only waits for its parent to read its exit code.
    return state not in "ZX" and start == self.start


def parse_writer(line: str) -> Writer | None:
  """The Writer that `Writer.line()` wrote, or None if `line` is not one."""
  match = _WRITER.fullmatch(line.strip())
  if match is None:
    return None
  pid, host, start = match.groups()
  return Writer(int(pid), host, None if start == "?" else int(start))


def this_process() -> Writer:
  """The calling process as a Writer."""
  try:
    _, start = _proc_stat(os.getpid())
  except OSError:
    start = None
  return Writer(os.getpid(), socket.gethostname(), start)


def _proc_stat(pid: int) -> tuple[str, int]:
  """(state, start time) of process `pid` from /proc/<pid>/stat.

  The command name (field 2) may hold spaces and parentheses: fields are
  counted from the last ')'.
  """
  with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
    text = f.read()
  fields = text[text.rindex(")") + 2:].split()
  try:
    return fields[0], int(fields[19])  # fields 3 and 22
  except (IndexError, ValueError):
    raise OSError(errno.EINVAL, f"unexpected /proc/{pid}/stat") from None


class RunDirLock:
  """The held lock of one run directory; `release()` (or `with`) gives it up.

  Also released when the object is garbage-collected or the process ends.
  """

  def __init__(self, run_dir: pathlib.Path, file):
    self.run_dir = run_dir
    self._file = file

  def release(self) -> None:
    """Gives the directory up (closing the file drops the flock); idempotent."""
    if self._file is not None:
      self._file.close()
      self._file = None

  def __enter__(self) -> RunDirLock:
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()


def lock_run_dir(run_dir: str | os.PathLike) -> RunDirLock:
  """Takes `run_dir`'s lock for this process, writing its Writer line into it.

  Creates `run_dir/.lock` if missing; writes nothing else, and nothing at all
  when refused.

  Raises:
    UserError: naming the directory and the live process, if another process
      (or another lock in this one) holds it; or if the lock file cannot be
      opened.
  """
  run_dir = pathlib.Path(run_dir)
  path = run_dir / LOCK_FILE
  try:
    # 'a+' creates without truncating: the holder's line stays readable.
    file = open(path, "a+", encoding="utf-8")
  except OSError as e:
    raise UserError(f"{run_dir}: cannot lock the run directory ({e.strerror or e}"
                    f" opening {path})") from None
  try:
    fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    file.seek(0)
    holder = parse_writer(file.read())
    file.close()
    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
      raise UserError(f"{run_dir}: cannot lock the run directory ({e.strerror or e})") from None
    who = f"pid {holder.pid} on {holder.host}" if holder else "another process"
    raise UserError(f"{run_dir}: in use by a live run ({who}); wait for it to end or"
                    " stop it first") from None
  try:  # Unbuffered: a full disk must not fail the close that releases the lock.
    os.ftruncate(file.fileno(), 0)
    os.write(file.fileno(), (this_process().line() + "\n").encode())
  except OSError:
    pass  # The line only lets a refused process name the holder.
  return RunDirLock(run_dir, file)


def wait_released(run_dirs, timeout_s: float) -> list[pathlib.Path]:
  """Waits until no process holds the lock of any of `run_dirs` (their runs'
  processes have ended), for at most `timeout_s` seconds.

  Returns:
    The directories whose lock is still held then.
  """
  held = [pathlib.Path(d) for d in run_dirs]
  deadline = time.monotonic() + timeout_s
  while True:
    held = [d for d in held if _held(d)]
    if not held or time.monotonic() >= deadline:
      return held
    time.sleep(0.1)


def _held(run_dir: pathlib.Path) -> bool:
  """Whether a process holds `run_dir`'s lock (taken and at once given back to see)."""
  try:
    with open(run_dir / LOCK_FILE, "rb") as file:
      fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
  return False  # closing the file gave the lock back
