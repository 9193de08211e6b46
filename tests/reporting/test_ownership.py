"""Who owns a run directory: a status writer's liveness, and the run-directory lock."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading

import pytest

from fedsim.errors import UserError
from fedsim.reporting import ownership, rundir



def _start_time(pid: int) -> int:
  """Field 22 of /proc/<pid>/stat, read here independently of fedsim."""
  with open(f"/proc/{pid}/stat") as f:
    return int(f.read().rsplit(")", 1)[1].split()[19])


@pytest.fixture
def sleeper():
  """A live child process; killed and reaped at the end."""
  child = subprocess.Popen(["sleep", "600"])
  yield child
  child.kill()
  child.wait()



def test_this_process_is_alive_and_named_by_pid_host_and_start_time():
  me = ownership.this_process()
  assert me == ownership.Writer(os.getpid(), socket.gethostname(), _start_time(os.getpid()))
  assert ownership.parse_writer(me.line()) == me
  assert me.alive() is True


def test_a_dead_writer_a_zombie_and_a_reused_pid_are_not_alive(sleeper):
  writer = ownership.Writer(sleeper.pid, socket.gethostname(), _start_time(sleeper.pid))
  assert writer.alive() is True
  # The same pid with another start time is another process than the writer.
  assert ownership.Writer(sleeper.pid, writer.host, writer.start + 1).alive() is False
  sleeper.send_signal(signal.SIGKILL)
  os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
  assert writer.alive() is False  # a zombie
  sleeper.wait()
  assert writer.alive() is False  # gone


def test_a_writer_on_another_host_or_without_start_time_cannot_be_told():
  assert ownership.Writer(os.getpid(), socket.gethostname() + "-x", 1).alive() is None
  assert ownership.Writer(os.getpid(), socket.gethostname(), None).alive() is None
  assert ownership.parse_writer("writer: pid 7 on h started ?") == ownership.Writer(7, "h", None)
  assert ownership.parse_writer("loss diverged at round 7") is None


def test_running_status_of_a_dead_writer_reads_killed(tmp_path, sleeper):
  start = _start_time(sleeper.pid)
  host = socket.gethostname()
  (tmp_path / "status").write_text(f"running\nwriter: pid {sleeper.pid} on {host} started"
                                   f" {start}\n")
  assert rundir.read_status(tmp_path) == ("running", "")
  sleeper.kill()
  sleeper.wait()
  status, message = rundir.read_status(tmp_path)
  assert status == "killed"
  # `fedsim status` offers the resume, only when one can succeed (test_status.py).
  assert message == f"process {sleeper.pid} ended without recording why (killed?)"
  # Only 'running' can be a lie; a file without a writer line reads as written.
  (tmp_path / "status").write_text(f"failed\nboom\nwriter: pid {sleeper.pid} on {host}"
                                   f" started {start}\n")
  assert rundir.read_status(tmp_path) == ("failed", "boom")
  (tmp_path / "status").write_text("running\n")
  assert rundir.read_status(tmp_path) == ("running", "")


def test_a_held_lock_refuses_others_and_dies_with_its_holder(tmp_path, lock_holder):
  child = lock_holder(tmp_path)
  before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
  with pytest.raises(UserError) as refused:
    ownership.lock_run_dir(tmp_path)
  assert str(refused.value) == (f"{tmp_path}: in use by a live run (pid {child.pid} on"
                                f" {socket.gethostname()}); wait for it to end or stop it first")
  assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing written
  child.send_signal(signal.SIGKILL)
  child.wait()
  with ownership.lock_run_dir(tmp_path):  # the kernel dropped the killed holder's lock
    with pytest.raises(UserError, match=f"pid {os.getpid()} on"):
      ownership.lock_run_dir(tmp_path)  # a second lock in the same process is refused too
  ownership.lock_run_dir(tmp_path).release()  # released by the `with`


def test_waiting_for_released_locks_ends_when_their_holders_have(tmp_path, lock_holder):
  held, free, never_run = tmp_path / "held", tmp_path / "free", tmp_path / "never_run"
  for run_dir in (held, free, never_run):
    run_dir.mkdir()
  ownership.lock_run_dir(free).release()
  child = lock_holder(held)
  assert ownership.wait_released([held, free, never_run], 0.3) == [held]
  # Looking wrote nothing: the holder's line is intact.
  assert (held / ownership.LOCK_FILE).read_text().startswith(f"writer: pid {child.pid} on")
  killer = threading.Timer(0.5, child.kill)
  killer.start()
  try:
    assert ownership.wait_released([held, free], 30) == []
  finally:
    killer.join()
