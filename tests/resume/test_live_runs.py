"""A run directory belongs to one live process; a killed run says so and restarts.

* A resume of a run that another process is running is refused in one line
  naming the directory and the live pid, and writes nothing into it.
* A run SIGKILLed is listed by `fedsim status` as `killed`, not `running`.
* A run killed before its first checkpoint restarts from round 0 in the same
  directory, and ends as an uninterrupted run of the same config.
"""

from __future__ import annotations

import csv
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

import fedsim
from fedsim import cli
from fedsim.errors import UserError
from fedsim.experiment import resume
from fedsim.experiment.config.loader import load_config, plain
from fedsim.reporting import ownership
from fedsim.state import checkpoint as ckpt
from fedsim.state.rewind import rewind_to_start
from tests.resume.events import steps_by_tag
from tests.resume.final_models import assert_same_final_model

# Enough rounds that a run stopped or killed at round 2-3 is still far from its
# last round (the only checkpoint below); each round more costs every run here.
# At 12, a test starved on a loaded machine (load 10) saw round 2 and killed a
# run that had meanwhile reached its last round.
ROUNDS = 24
CONFIG = {
    "name": "live", "seed": 4, "rounds": ROUNDS, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 6, "partition": "iid", "batch_size": 32},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg"},
    "eval": {"every": 1},
    # Only the last round is checkpointed (checkpoint.every: 2 in the tests that want more).
    "checkpoint": {"every": 100, "keep": 1},
}
WALL_CLOCK = ("round_seconds",)


def _resolved(config: dict) -> dict:
  resolved = plain(load_config(config)[0])
  resolved.pop("variants")
  return resolved


def _fake_run(logdir: pathlib.Path, name: str, checkpoint: bool,
              status: str = "interrupted", config: dict = CONFIG) -> pathlib.Path:
  """A run directory as a stopped run leaves it: config.yaml, status, maybe a checkpoint."""
  run_dir = logdir / config["name"] / name
  run_dir.mkdir(parents=True)
  (run_dir / "config.yaml").write_text(yaml.safe_dump(_resolved(config)))
  (run_dir / "status").write_text(status + "\n")
  if checkpoint:
    ckpt.save_checkpoint(run_dir, 1, [np.zeros(2)], 0.0, [1], [1], keep=1)
  os.utime(run_dir / "config.yaml", (int(name[-2:]), int(name[-2:])))  # newest: highest
  return run_dir


def _files(directory: pathlib.Path) -> dict[str, bytes]:
  return {str(p.relative_to(directory)): p.read_bytes()
          for p in sorted(directory.rglob("*")) if p.is_file()}



def test_a_resume_of_a_live_run_is_refused_in_one_line_and_writes_nothing(
    tmp_path, lock_holder, capsys):
  run_dir = _fake_run(tmp_path, "20260101-000001", checkpoint=True, status="running")
  live = lock_holder(run_dir)
  before = _files(run_dir)
  config = tmp_path / "live.yaml"
  config.write_text(yaml.safe_dump(CONFIG))
  refusal = (f"{run_dir}: in use by a live run (pid {live.pid} on {socket.gethostname()});"
             " wait for it to end or stop it first")
  assert cli.main(["run", str(config), "--logdir", str(tmp_path), "--resume",
                   str(run_dir)]) == 2
  assert capsys.readouterr().err.splitlines() == [f"fedsim: error: {refusal}"]
  with pytest.raises(UserError) as raised:
    fedsim.run(CONFIG, logdir=tmp_path, resume=run_dir)
  assert str(raised.value) == refusal
  # `--resume` without a directory leaves the live run to its process, and says so.
  assert cli.main(["run", str(config), "--logdir", str(tmp_path), "--resume"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert f"{run_dir.name}: left alone, another process is running {run_dir}" in out
  assert any(line.split()[:2] == [run_dir.name, "running"] for line in out), out
  assert _files(run_dir) == before


def test_resume_passes_live_runs_over_and_prefers_a_checkpoint_to_a_restart(tmp_path,
                                                                              lock_holder):
  resolved = _resolved(CONFIG)
  oldest = _fake_run(tmp_path, "20260101-000001", checkpoint=True)
  older = _fake_run(tmp_path, "20260101-000002", checkpoint=False)
  newest = _fake_run(tmp_path, "20260101-000003", checkpoint=True, status="running")
  lock_holder(newest)
  chosen = resume.choose(tmp_path, "live", None, resolved, True, False)
  assert (chosen.run_dir, chosen.checkpoint.round_num) == (oldest, 1)
  with pytest.raises(UserError, match="in use by a live run"):  # held until released
    ownership.lock_run_dir(oldest)
  ownership.lock_run_dir(older).release()  # the candidate passed over was let go
  chosen.lock.release()
  # With no checkpoint anywhere, the newest stopped run restarts from round 0.
  ckpt.shutil.rmtree(oldest / "checkpoints")
  chosen = resume.choose(tmp_path, "live", None, resolved, True, False)
  assert (chosen.run_dir, chosen.checkpoint) == (older, None)
  chosen.lock.release()
  explicit = resume.choose(tmp_path, "live", None, resolved, oldest, False)
  assert (explicit.run_dir, explicit.checkpoint) == (oldest, None)
  explicit.lock.release()


def test_a_completed_run_without_checkpoints_is_not_restarted(tmp_path):
  run_dir = _fake_run(tmp_path, "20260101-000001", checkpoint=False, status="completed")
  with pytest.raises(UserError, match="a completed run without a checkpoint to extend from"):
    resume.choose(tmp_path, "live", None, _resolved(CONFIG), run_dir, False)
  ownership.lock_run_dir(run_dir).release()  # a refused resume lets the directory go


def test_rewind_to_start_clears_what_the_stopped_attempt_logged(tmp_path):
  run_dir = tmp_path / "run"
  logged = ["metrics.csv", "clients.csv", "events.log", "events.out.tfevents.1.h",
            "simulated_time/events.out.tfevents.2.h", "by_bits/events.out.tfevents.3.h",
            "client_states/c0.npz", "checkpoints/.round_2.tmp/server_state.npz"]
  kept = ["config.yaml", "status", "worker.log", ".lock", "notes.txt",
          "simulated_time/notes.txt"]
  for name in logged + kept:
    (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / name).write_text("x")
  rewind_to_start(run_dir)
  assert sorted(_files(run_dir)) == sorted(kept)
  assert not (run_dir / "client_states").exists() and not (run_dir / "checkpoints").exists()


def _fedsim(*args: str) -> subprocess.Popen:
  """`fedsim run ARGS` in its own session (a stop reaches its worker too)."""
  env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.Popen([sys.executable, "-m", "fedsim.cli", "run", *args, "--no-progress"],
                          env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)


def _started_run(process: subprocess.Popen, experiment_dir: pathlib.Path,
                 round_num: int) -> pathlib.Path:
  """The run directory of `process` once its metrics.csv has `round_num` rounds."""
  deadline = time.monotonic() + 240
  while time.monotonic() < deadline:
    if process.poll() is not None:
      raise AssertionError(f"the run ended before round {round_num}: {process.stderr.read()}")
    runs = list(experiment_dir.glob("*/metrics.csv"))
    if runs and runs[0].read_text().count("\n") > round_num:  # header + rows
      return runs[0].parent
    time.sleep(0.01)
  raise AssertionError(f"round {round_num} not reached in time")


def _wait_stopped(pid: int) -> None:
  """Returns once every thread of process `pid` is stopped (state T; or gone, a
  thread that exited meanwhile)."""
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline:
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
      try:
        stat = pathlib.Path(f"/proc/{pid}/task/{task}/stat").read_text()
      except OSError:
        continue  # the thread exited between the listing and the read
      states.append(stat.rsplit(")", 1)[1].split()[0])
    if all(state in "TtZX" for state in states):
      return
    time.sleep(0.01)
  raise AssertionError(f"process {pid} did not stop")


def _rows(run_dir: pathlib.Path) -> list[dict[str, str]]:
  with open(run_dir / "metrics.csv", newline="") as f:
    return [{k: v for k, v in row.items() if k not in WALL_CLOCK} for row in csv.DictReader(f)]


@pytest.mark.slow
def test_a_live_run_is_not_taken_over_and_completes_intact(tmp_path, capsys):
  config = tmp_path / "live.yaml"
  config.write_text(yaml.safe_dump(dict(CONFIG, checkpoint={"every": 2, "keep": 1})))
  live = _fedsim(str(config), "--logdir", str(tmp_path / "runs"))
  try:
    run_dir = _started_run(live, tmp_path / "runs" / "live", 3)  # past a checkpoint
    # Stopped, it holds its lock and its files stay still while a second process tries.
    os.killpg(live.pid, signal.SIGSTOP)
    _wait_stopped(live.pid)  # the signal is delivered asynchronously: a write may be under way
    before = {k: v for k, v in _files(run_dir).items() if k != "worker.log"}
    second = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "run", str(config), "--logdir",
         str(tmp_path / "runs"), "--resume", str(run_dir), "--no-progress"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert cli.main(["status", str(run_dir)]) == 0
    assert capsys.readouterr().out.startswith(f"{run_dir}: running, round ")
    # Compared while the live run is still stopped: once continued, it writes again.
    after = {k: v for k, v in _files(run_dir).items() if k != "worker.log"}
    os.killpg(live.pid, signal.SIGCONT)
    assert second.returncode == 2, second.stderr
    assert second.stderr.splitlines() == [
        f"fedsim: error: {run_dir}: in use by a live run (pid {live.pid} on"
        f" {socket.gethostname()}); wait for it to end or stop it first"]
    assert after == before
    out, err = live.communicate(timeout=600)
    assert live.returncode == 0, err
  finally:
    if live.poll() is None:
      os.killpg(live.pid, signal.SIGKILL)
      live.communicate()
  assert [r["round"] for r in _rows(run_dir)] == [str(r) for r in range(1, ROUNDS + 1)]
  assert (run_dir / "status").read_text().startswith("completed\n")


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_is_listed_killed_and_restarts(
    tmp_path, capsys):
  config = tmp_path / "live.yaml"
  config.write_text(yaml.safe_dump(CONFIG))
  killed = _fedsim(str(config), "--logdir", str(tmp_path / "runs"))
  try:
    run_dir = _started_run(killed, tmp_path / "runs" / "live", 2)
    killed.send_signal(signal.SIGKILL)
  finally:
    killed.kill()
    killed.communicate()
  assert ckpt.latest_checkpoint(run_dir) is None  # killed before the only checkpoint
  logged = len(_rows(run_dir))
  assert cli.main(["status", str(run_dir)]) == 0
  assert capsys.readouterr().out.splitlines() == [
      f"{run_dir}: killed, round {logged} of {ROUNDS}, no checkpoint: process {killed.pid}"
      f" ended without recording why (killed?); resume with: fedsim run --resume {run_dir}"]

  resumed = _fedsim("--resume", str(run_dir))  # as the status line says
  out, err = resumed.communicate(timeout=600)
  assert resumed.returncode == 0, err
  assert f"restarting {run_dir} from round 0 of {ROUNDS}" in out
  # The uninterrupted run in this process: no TensorFlow import of its own.
  assert cli.main(["run", str(config), "--logdir", str(tmp_path / "reference"),
                   "--no-progress"]) == 0
  (ref_dir,) = [p for p in (tmp_path / "reference" / "live").iterdir()
                if (p / "config.yaml").is_file()]

  assert (run_dir / "status").read_text().startswith("completed\n")
  rows = _rows(run_dir)
  assert [r["round"] for r in rows] == [str(r) for r in range(1, ROUNDS + 1)]
  assert rows == _rows(ref_dir)  # every metric, bit for bit
  assert (run_dir / "clients.csv").read_text() == (ref_dir / "clients.csv").read_text()
  # The reference ran in this process, after other models.
  assert_same_final_model(run_dir / "final_model.npz", ref_dir / "final_model.npz")
  steps, ref_steps = steps_by_tag(run_dir), steps_by_tag(ref_dir)
  assert steps["train/loss"] == list(range(1, ROUNDS + 1))  # each round once
  assert steps["eval/accuracy_by_bits"] == ref_steps["eval/accuracy_by_bits"]
  # No link or device model: no accuracy by simulated time.
  assert "eval/accuracy_by_simulated_ms" not in steps | ref_steps
