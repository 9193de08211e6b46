"""The driver's process against Ray: a private instance ends with it, however
it ends, and its signal handlers stay fedsim's.

`ray.init(address="local")` starts the GCS and the raylet with
PR_SET_PDEATHSIG, so they die with the driver; but the raylet's agents
(dashboard agent, runtime-env agent) only notice that the raylet is gone,
then try to report it to the dead GCS and linger for about a minute, and a
driver that leaves by `os._exit` (fedsim's signalled exit) or SIGKILL never
runs `ray.shutdown()`. So fedsim tags the instance: every process started
while `tagged()` is active inherits a unique environment variable (Ray's
processes pass their environment on to the processes they start), and a
small watcher process, which is not in the driver's process group (a Ctrl-C
to the terminal does not reach it), SIGKILLs every process of this user
carrying the tag once the driver closes the watcher's pipe: by `sweep()`, or
by dying. Linux only (it reads /proc); elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import uuid
from typing import Iterator

TAG = "FEDSIM_RAY_INSTANCE"
# Also set for the instance's processes: its raylet exited ('Runtime Env Agent
# timed out in 30000ms') when its runtime-env agent, a Python process, took
# over 30 s to start: 1 in 5 starts on two cores kept busy by other processes.
_PATIENT = {"RAY_agent_register_timeout_ms": "300000"}

# Runs in the watcher: wait for EOF on stdin (the driver closed the pipe or
# died), then SIGKILL the tagged processes until none is left (a raylet may
# still be starting a worker), for at most ~10 s.
_WATCHER = r"""
import os, signal, sys, time
tag = ("\0" + sys.argv[1] + "\0").encode()
while sys.stdin.buffer.read(4096):
    pass
uid = os.getuid()
for _ in range(50):
    found = False
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if os.stat("/proc/" + name).st_uid != uid:
                continue
            with open("/proc/" + name + "/environ", "rb") as f:
                if tag not in b"\0" + f.read():
                    continue
            os.kill(int(name), signal.SIGKILL)
            found = True
        except (OSError, ValueError):
            continue
    if not found:
        break
    time.sleep(0.2)
"""


class Reaper:
  """The watcher of one private Ray instance (see the module docstring)."""

  def __init__(self):
    self._tag = f"{TAG}={uuid.uuid4().hex}"
    self._watcher: subprocess.Popen | None = None
    if sys.platform.startswith("linux") and os.path.isdir("/proc"):
      # Its stdin is the pipe's read end; the write end stays in this process
      # only (not inheritable), so EOF means this process closed it or died.
      self._watcher = subprocess.Popen(
          [sys.executable, "-c", _WATCHER, self._tag], stdin=subprocess.PIPE,
          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
          env={k: v for k, v in os.environ.items() if k != TAG})

  @contextlib.contextmanager
  def tagged(self) -> Iterator[None]:
    """Processes started in the body (the instance's nodes) carry the tag
    (and wait for a slow agent, unless the environment says otherwise)."""
    name, value = self._tag.split("=", 1)
    added = {name: value, **{k: v for k, v in _PATIENT.items() if k not in os.environ}}
    os.environ.update(added)
    try:
      yield
    finally:
      for key in added:  # later children (a TFF worker, a plugin's) are not Ray's
        os.environ.pop(key, None)

  def sweep(self) -> None:
    """Kills what is left of the instance (after `ray.shutdown()`); idempotent."""
    watcher, self._watcher = self._watcher, None
    if watcher is None:
      return
    try:
      watcher.stdin.close()
      watcher.wait(timeout=15)
    except (OSError, subprocess.TimeoutExpired):
      watcher.kill()
      watcher.wait()


@contextlib.contextmanager
def process_handlers_kept() -> Iterator[None]:
  """Undoes what `ray.init` does to the whole process: its SIGTERM handler
  (`sys.exit(15)`, which replaced fedsim's exit 143 and status `interrupted`)
  and faulthandler's stack dumps on fatal signals."""
  main = threading.current_thread() is threading.main_thread()
  sigterm = signal.getsignal(signal.SIGTERM) if main else None
  dumps = faulthandler.is_enabled()
  try:
    yield
  finally:
    if main and sigterm is not None:
      signal.signal(signal.SIGTERM, sigterm)
    if not dumps:
      faulthandler.disable()


@contextlib.contextmanager
def ray_log_off_the_terminal() -> Iterator[None]:
  """Keeps the log of the Ray core worker `ray.init` starts in this process
  off its stderr, which is fedsim's.

  Without Ray's optional dashboard packages no node runs a metrics agent, and
  every core worker logs an error to its stderr once it gave up waiting for
  one (30 s after connecting). No Ray setting turns the wait off: its log level
  (RAY_BACKEND_LOG_LEVEL) can, and is read as the core worker starts, which
  says so on stderr: that line goes to /dev/null. A level the environment
  sets is left as it is, the lines with it.
  """
  if "RAY_BACKEND_LOG_LEVEL" in os.environ:
    yield
    return
  os.environ["RAY_BACKEND_LOG_LEVEL"] = "fatal"
  sys.stderr.flush()
  stderr = os.dup(2)
  null = os.open(os.devnull, os.O_WRONLY)
  os.dup2(null, 2)
  os.close(null)
  try:
    yield
  finally:
    os.dup2(stderr, 2)
    os.close(stderr)
    del os.environ["RAY_BACKEND_LOG_LEVEL"]  # not for later children (a run's process)
