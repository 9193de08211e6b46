"""Computations outside sessions, nested sessions, a dead worker; JSON report.

Usage: guard.py OUT_DIR. Installs the guard, writes OUT_DIR/report.json and
exits normally, so the guard's worker must be stopped by fedsim's atexit hook.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np

from fedsim.errors import RunFailed
from fedsim import runtime
from fedsim.backend import quiet
from fedsim.runtime import session as runtime_session
from fedsim.runtime import worker_binary as runtime_worker

tff = quiet.import_tff()


@tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
def total(values):
  return tff.federated_sum(values)


def worker_children() -> dict[str, dict[str, str]]:
  """Children of this process running worker_binary: pid -> fd -> target."""
  found = {}
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = f.read()
      if ppid == os.getpid() and b"worker_binary" in cmd:
        found[pid] = {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in ("0", "1", "2")}
    except (OSError, IndexError):  # Gone meanwhile.
      pass
  return found


def event_loop_threads() -> int:
  """Threads running a TFF context's event loop (named after its target_fn)."""
  return sum(t.name.endswith("(target_fn)") for t in threading.enumerate())


def wait_dead(worker) -> None:
  deadline = time.monotonic() + 10
  while worker.alive and time.monotonic() < deadline:
    time.sleep(0.01)


def main(out_dir: str) -> None:
  runtime.install_guard()
  report = {"guard_before_call": runtime_session._guard is None}
  report["guard_result"] = int(total([1, 2, 3]))
  guard = runtime_session._guard
  report["guard_pid"], report["guard_log"] = guard.pid, guard.log_path
  report["children"] = worker_children()
  report["own_stdout"] = os.readlink("/proc/self/fd/1")
  tf = quiet.import_tensorflow()
  report["same_tf"] = tf is quiet.import_tensorflow() is sys.modules["tensorflow"]

  # Forked for a thread that then ends: the worker must outlive the thread.
  box = {}
  thread = threading.Thread(target=lambda: box.update(
      worker=runtime_worker.Worker(os.path.join(out_dir, "thread.log")).start()))
  thread.start()
  thread.join()
  time.sleep(0.5)
  report["thread_worker_pid"] = box["worker"].pid
  report["thread_worker_alive"] = box["worker"].alive
  box["worker"].stop()

  threads_before = event_loop_threads()
  with runtime_session.session(os.path.join(out_dir, "outer.log")) as outer:
    report["outer_result"] = int(total([1, 2]))
    with runtime_session.session(os.path.join(out_dir, "inner.log")) as inner:
      os.kill(outer.pid, signal.SIGKILL)
      wait_dead(outer)
      report["inner_result"] = int(total([4, 5]))
    report["outer_pid"], report["inner_pid"] = outer.pid, inner.pid
    # Back on the outer session, whose worker is dead; same cardinality as
    # before, so TFF first tries its cached executor and retries.
    try:
      report["dead_call"] = f"returned {total([1, 2])}"
    except RunFailed as e:
      report["dead_call"] = str(e)
    try:
      outer.check_alive("round 7")
      report["check_alive"] = "no error"
    except RunFailed as e:
      report["check_alive"] = str(e)
  report["threads_added_by_sessions"] = event_loop_threads() - threads_before
  report["after_sessions_result"] = int(total([7, 8]))
  report["guard_pid_after_sessions"] = runtime_session._guard.pid
  # A dead guard worker is replaced at the next call.
  os.kill(guard.pid, signal.SIGKILL)
  wait_dead(guard)
  report["replaced_guard_result"] = int(total([1, 1]))
  report["replaced_guard_pid"] = runtime_session._guard.pid

  try:
    runtime_worker.Worker(os.path.join(out_dir, "bad.log"), binary="/bin/false").start()
    report["start_failure"] = "started"
  except RunFailed as e:
    report["start_failure"] = str(e)
  report["owned_after_failure"] = len(runtime_worker._owned)  # pylint: disable=protected-access

  with open(os.path.join(out_dir, "report.json"), "w") as f:
    json.dump(report, f)
  print("report written", flush=True)


if __name__ == "__main__":
  main(sys.argv[1])
