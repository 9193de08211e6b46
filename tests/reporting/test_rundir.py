from __future__ import annotations

import os
import re
import socket

import pytest
import yaml

from fedsim.errors import UserError
from fedsim.reporting import rundir


def test_default_name_is_timestamp_with_collision_suffix(tmp_path, monkeypatch):
  monkeypatch.setattr(rundir.time, "strftime", lambda fmt: "20250102-030405")
  first = rundir.create_run_dir(tmp_path, "mnist")
  second = rundir.create_run_dir(tmp_path, "mnist")
  third = rundir.create_run_dir(tmp_path, "mnist")
  assert first == tmp_path / "mnist" / "20250102-030405"
  assert second.name == "20250102-030405-1"
  assert third.name == "20250102-030405-2"
  assert all(p.is_dir() and not any(p.iterdir()) for p in (first, second, third))


def test_real_timestamp_format(tmp_path):
  run_dir = rundir.create_run_dir(tmp_path, "exp")
  assert re.fullmatch(r"\d{8}-\d{6}", run_dir.name)


def test_explicit_run_name_never_reuses_existing_dir(tmp_path):
  existing = tmp_path / "exp" / "baseline"
  existing.mkdir(parents=True)
  (existing / "metrics.csv").write_text("round\n1\n")
  run_dir = rundir.create_run_dir(tmp_path, "exp", run="baseline")
  assert run_dir == tmp_path / "exp" / "baseline-1"
  assert (existing / "metrics.csv").read_text() == "round\n1\n"


def test_logdir_under_a_file_is_user_error(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(UserError, match=str(blocker / "exp")):
    rundir.create_run_dir(blocker, "exp")


def test_unwritable_logdir_is_user_error():
  with pytest.raises(UserError, match="/proc/fedsim-test/exp"):
    rundir.create_run_dir("/proc/fedsim-test", "exp")


@pytest.mark.parametrize("name, run", [("a/b", None), ("..", None), ("exp", ""), ("exp", "x/y")])
def test_bad_names_are_user_errors(tmp_path, name, run):
  with pytest.raises(UserError, match="not a valid directory name"):
    rundir.create_run_dir(tmp_path, name, run)


def test_write_config_keeps_key_order(tmp_path):
  config = {"name": "exp", "rounds": 3, "model": {"name": "mlp", "hidden": [200, 200]}}
  rundir.write_config(tmp_path, config)
  text = (tmp_path / "config.yaml").read_text()
  assert text.splitlines()[:2] == ["name: exp", "rounds: 3"]
  assert yaml.safe_load(text) == config
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def _writer_line() -> str:
  """This process as the status file names it: pid, host, start time (field 22)."""
  with open(f"/proc/{os.getpid()}/stat") as f:
    start = f.read().rsplit(")", 1)[1].split()[19]
  return f"writer: pid {os.getpid()} on {socket.gethostname()} started {start}"


def test_status_round_trip(tmp_path):
  assert rundir.read_status(tmp_path) == ("", "")
  rundir.write_status(tmp_path, "running")
  assert (tmp_path / "status").read_text() == f"running\n{_writer_line()}\n"
  assert rundir.read_status(tmp_path) == ("running", "")
  rundir.write_status(tmp_path, "failed", "loss diverged at round 7")
  assert rundir.read_status(tmp_path) == ("failed", "loss diverged at round 7")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["status"]


def test_unknown_status_rejected(tmp_path):
  with pytest.raises(ValueError):
    rundir.write_status(tmp_path, "done")


def test_status_is_written_on_a_full_disk(small_disk):
  run_dir = small_disk.path
  rundir.write_status(run_dir, "running")
  small_disk.fill()
  with pytest.raises(OSError, match="No space left"):  # the disk refuses new data
    (run_dir / "probe").write_text("x")
  (run_dir / "probe").unlink()
  message = "no space left on device (writing " + str(run_dir / "metrics.csv") + ")"
  rundir.write_status(run_dir, "failed", message)
  assert rundir.read_status(run_dir) == ("failed", message)
  assert (run_dir / "status").read_text() == f"failed\n{message}\n{_writer_line()}\n"
  rundir.write_status(run_dir, "interrupted")  # shorter than before: cut, no old tail
  assert (run_dir / "status").read_text() == f"interrupted\n{_writer_line()}\n"
  assert sorted(p.name for p in run_dir.iterdir()) == [".filler", "status"]
