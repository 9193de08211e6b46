"""The proof: a study interrupted again and again, each time continued with the
command it printed, ends equal to an uninterrupted study.

4 variants x 3 seeds of tiny runs. Each interruption is one Ctrl-C delivered
twice 10 ms apart to the process group, as `uv run` in a terminal delivers
it (the terminal signals the group, uv forwards its copy): it must count as
one interrupt, exit 130 and print the command that continues the whole
study. Moments: during start-up (TensorFlow importing), mid-run (between two
rounds' writes, checkpoints every round), and between runs (a run just
completed).
"""

from __future__ import annotations

import csv
import os
import pathlib
import random
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from fedsim.reporting.rundir import read_status

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = """
name: proof
seed: 1
rounds: 3
clients_per_round: 2
data: {name: digits, num_clients: 4, partition: dirichlet, alpha: 0.5, batch_size: 16}
model: {name: logistic}
eval: {every: 1}
checkpoint: {every: 1, keep: 2}
seeds: [0, 1, 2]
variants:
  sgd: {}
  slow: {algorithm: {name: fedavg, client_optimizer: {name: sgd, learning_rate: 0.02}}}
  uniform8: {compression: {aggregation: {encoder: uniform, bits: 8, min_elements: 10}}}
  prox: {algorithm: {name: fedprox, mu: 0.1}}
"""
RUNS = [f"{v}-seed{s}" for v in ("sgd", "slow", "uniform8", "prox") for s in range(3)]
WALL_CLOCK = ("round_seconds",)
TIMEOUT_S = 900


def _start(args: list[str]) -> subprocess.Popen:
  env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                          # as a terminal's job: Ctrl-C not ignored
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _fedsim(*args: str) -> subprocess.Popen:
  return _start([sys.executable, "-m", "fedsim.cli", "run", *args, "--no-progress"])


def _rows(run_dir: pathlib.Path) -> list[dict[str, str]]:
  with open(run_dir / "metrics.csv", newline="") as f:
    return [{k: v for k, v in row.items() if k not in WALL_CLOCK} for row in csv.DictReader(f)]


def _lines(path: pathlib.Path) -> int:
  try:
    return path.read_text().count("\n")
  except OSError:
    return 0


def _progress(study: pathlib.Path) -> tuple[int, int]:
  """(rows in all metrics.csv files, runs completed)."""
  rows = sum(_lines(study / run / "metrics.csv") for run in RUNS)
  done = sum((study / run / "status").is_file()
             and (study / run / "status").read_text().startswith("completed") for run in RUNS)
  return rows, done


def _wait_for_moment(process: subprocess.Popen, study: pathlib.Path, kind: str,
                     rng: random.Random) -> bool:
  """Waits for a moment of `kind`; False if the process ended first."""
  deadline = time.monotonic() + TIMEOUT_S
  if kind == "start-up":
    time.sleep(rng.uniform(0.5, 4.0))
    return process.poll() is None
  rows, done = _progress(study)
  while time.monotonic() < deadline and process.poll() is None:
    now_rows, now_done = _progress(study)
    if (kind == "mid-run" and now_rows > rows) or (kind == "between runs" and now_done > done):
      time.sleep(rng.uniform(0.0, 0.3))
      return process.poll() is None
    time.sleep(0.02)
  return False


def _ctrl_c_through_uv(process: subprocess.Popen) -> None:
  os.killpg(process.pid, signal.SIGINT)
  time.sleep(0.01)
  os.killpg(process.pid, signal.SIGINT)


def _interrupted_study(tmp_path: pathlib.Path, moments: list[str], seed: int) -> pathlib.Path:
  config = tmp_path / "proof.yaml"
  config.write_text(CONFIG)
  study = tmp_path / "runs" / "proof"
  rng = random.Random(seed)
  command = [sys.executable, "-m", "fedsim.cli", "run", str(config), "--logdir",
             str(tmp_path / "runs"), "--no-progress"]
  interrupted = 0
  for kind in moments:
    process = _start(command)
    try:
      if kind == "start-up" and not study.is_dir():  # the plan first: it names the study
        while not (study / "study.yaml").is_file() and process.poll() is None:
          time.sleep(0.02)
      if not _wait_for_moment(process, study, kind, rng):  # it finished before this moment
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        break
      _ctrl_c_through_uv(process)
      out, err = process.communicate(timeout=60)
    finally:
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    interrupted += 1
    assert process.returncode == 130, (kind, err)
    assert "interrupted again" not in err and "Traceback" not in err, (kind, err)
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(r"fedsim: interrupted; resume with: (.*)", last)
    assert match, (kind, err)
    command = shlex.split(match.group(1))
    assert command[0] == "python" or os.path.samefile(command[0], sys.executable), command
    assert command[1:] == ["-m", "fedsim.cli", "run", "--resume", str(study)], (kind, command)
    command = [sys.executable, *command[1:], "--no-progress"]
  else:
    process = _start(command)
    out, err = process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == 0, err
  assert interrupted >= 1
  return study


def _assert_equal_studies(got: pathlib.Path, want: pathlib.Path, runs=RUNS, rounds=3) -> None:
  for run in runs:
    assert (got / run / "status").read_text().startswith("completed"), run
    rows = _rows(got / run)
    assert [r["round"] for r in rows] == [str(r) for r in range(1, rounds + 1)], run
    assert rows == _rows(want / run), run  # every metric, bit for bit (repr of floats)
    # In file order: the names carry Keras's per-process layer counter ('dense_3/kernel'
    # in the 4th model one process built), which differs between one process and several.
    with np.load(got / run / "final_model.npz") as a, np.load(want / run / "final_model.npz") as b:
      assert len(a.files) == len(b.files) > 0
      for x, y in zip(a.files, b.files):
        np.testing.assert_array_equal(a[x], b[y])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> pathlib.Path:
  """The uninterrupted study, one process, sequential."""
  tmp = tmp_path_factory.mktemp("reference")
  (tmp / "proof.yaml").write_text(CONFIG)
  process = _fedsim(str(tmp / "proof.yaml"), "--logdir", str(tmp / "runs"))
  out, err = process.communicate(timeout=TIMEOUT_S)
  assert process.returncode == 0, err
  return tmp / "runs" / "proof"


@pytest.mark.slow
def test_a_study_interrupted_at_three_moments_equals_the_uninterrupted_one(reference, tmp_path):
  study = _interrupted_study(tmp_path, ["start-up", "mid-run", "between runs"], seed=0)
  _assert_equal_studies(study, reference)


@pytest.mark.long
@pytest.mark.slow
def test_a_study_interrupted_at_ten_random_moments_equals_the_uninterrupted_one(
    reference, tmp_path):
  rng = random.Random(10)
  moments = [rng.choice(["start-up", "mid-run", "between runs"]) for _ in range(10)]
  study = _interrupted_study(tmp_path, moments, seed=10)
  _assert_equal_studies(study, reference)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [
    "sgd",  # 3 runs: two at once, then the third
    pytest.param(None, marks=pytest.mark.long)])  # all 12
def test_two_jobs_give_the_sequential_study(reference, tmp_path, variant):
  (tmp_path / "proof.yaml").write_text(CONFIG)
  chosen = ["--variant", variant] if variant else []
  process = _fedsim(str(tmp_path / "proof.yaml"), "--logdir", str(tmp_path / "runs"),
                    "--jobs", "2", *chosen)
  out, err = process.communicate(timeout=TIMEOUT_S)
  assert process.returncode == 0, err
  runs = [run for run in RUNS if variant is None or run.startswith(f"{variant}-")]
  assert sorted(re.findall(r"^started (\S+) ", out, re.M)) == sorted(runs)
  _assert_equal_studies(tmp_path / "runs" / "proof", reference, runs)


def _player_of(run_dir: pathlib.Path, study_pid: int) -> int | None:
  """The pid of the study's player process playing `run_dir` (its --resume child's
  log is open there: the player is the process whose fd 1 is that output.log)."""
  found = subprocess.run(["pgrep", "-P", str(study_pid)], capture_output=True, text=True).stdout
  for pid in map(int, found.split()):
    try:
      if os.readlink(f"/proc/{pid}/fd/1") == str(run_dir / "output.log"):
        return pid
    except OSError:
      continue
  return None


@pytest.mark.slow
def test_two_jobs_go_on_when_a_player_is_killed_and_its_run_resumes(reference, tmp_path):
  (tmp_path / "proof.yaml").write_text(CONFIG)
  study = tmp_path / "runs" / "proof"
  process = _fedsim(str(tmp_path / "proof.yaml"), "--logdir", str(tmp_path / "runs"),
                    "--jobs", "2", "--variant", "sgd")
  try:
    deadline = time.monotonic() + TIMEOUT_S
    victim, spared = None, set()
    while process.poll() is None and time.monotonic() < deadline and victim is None:
      for run in RUNS[:3]:
        if run in spared or _lines(study / run / "metrics.csv") < 2:
          continue  # not yet mid-run: no round logged
        pid = _player_of(study / run, process.pid)
        if pid is None:
          continue
        # Frozen, its run is mid-run for sure or already completed (3 short rounds):
        # killed in the first case, let go in the second.
        os.kill(pid, signal.SIGSTOP)
        if read_status(study / run)[0] == "completed" or _lines(study / run / "metrics.csv") > 3:
          spared.add(run)
          os.kill(pid, signal.SIGCONT)
          continue
        os.kill(pid, signal.SIGKILL)
        victim = (run, pid)
        break
      time.sleep(0.02)
    assert victim is not None, (spared, process.communicate())
    out, err = process.communicate(timeout=TIMEOUT_S)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.communicate()
  run = victim[0]
  assert process.returncode == 1, err
  assert f"fedsim: run failed: {run}: its process (pid {victim[1]}) died with exit code -9" in err
  assert err.strip().splitlines()[-1].endswith(f"fedsim.cli run --resume {study}"), err
  assert read_status(study / run)[0] == "killed"  # its writer is gone: resumable
  others = [r for r in RUNS[:3] if r != run]
  assert [(study / r / "status").read_text().split("\n")[0] for r in others] == ["completed"] * 2
  resumed = _fedsim("--resume", str(study), "--jobs", "2")
  _, err = resumed.communicate(timeout=TIMEOUT_S)
  assert resumed.returncode == 0, err
  assert "resuming" in (study / run / "output.log").read_text()
  _assert_equal_studies(study, reference, RUNS[:3])
