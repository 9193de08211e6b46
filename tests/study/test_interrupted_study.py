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

from fedsim import cli
from fedsim.reporting.rundir import read_status
from fedsim.state.checkpoint import intact_checkpoints

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
# The default run's study: 2 variants x 2 seeds, every moment and path of the
# full one (a variant that compresses, a run after a run, two runs at once).
SMALL = (CONFIG.replace("seeds: [0, 1, 2]", "seeds: [0, 1]")
         .replace("  slow: {algorithm: {name: fedavg, client_optimizer: {name: sgd, learning_rate:"
                  " 0.02}}}\n", "")
         .replace("  prox: {algorithm: {name: fedprox, mu: 0.1}}\n", ""))
SMALL_RUNS = [f"{v}-seed{s}" for v in ("sgd", "uniform8") for s in range(2)]
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


def _progress(study: pathlib.Path, runs: list[str]) -> tuple[int, int]:
  """(rows in all metrics.csv files, runs completed)."""
  rows = sum(_lines(study / run / "metrics.csv") for run in runs)
  done = sum((study / run / "status").is_file()
             and (study / run / "status").read_text().startswith("completed") for run in runs)
  return rows, done


def _wait_for_moment(process: subprocess.Popen, study: pathlib.Path, runs: list[str],
                     kind: str, rng: random.Random) -> bool:
  """Waits for a moment of `kind`; False if the process ended first."""
  deadline = time.monotonic() + TIMEOUT_S
  if kind == "start-up":
    time.sleep(rng.uniform(0.5, 4.0))
    return process.poll() is None
  rows, done = _progress(study, runs)
  while time.monotonic() < deadline and process.poll() is None:
    now_rows, now_done = _progress(study, runs)
    if (kind == "mid-run" and now_rows > rows) or (kind == "between runs" and now_done > done):
      time.sleep(rng.uniform(0.0, 0.3))
      return process.poll() is None
    time.sleep(0.02)
  return False


def _ctrl_c_through_uv(process: subprocess.Popen) -> None:
  os.killpg(process.pid, signal.SIGINT)
  time.sleep(0.01)
  os.killpg(process.pid, signal.SIGINT)


def _interrupted_study(tmp_path: pathlib.Path, moments: list[str], seed: int,
                       text: str = CONFIG, runs: list[str] = RUNS) -> pathlib.Path:
  config = tmp_path / "proof.yaml"
  config.write_text(text)
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
      if not _wait_for_moment(process, study, runs, kind, rng):  # it finished before this moment
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        break
      _ctrl_c_through_uv(process)
      out, err = process.communicate(timeout=60)
    finally:
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    assert "interrupted again" not in err and "Traceback" not in err, (kind, err)
    if process.returncode == 0:  # the study ended first: the Ctrl-C came as it exited
      assert _progress(study, runs)[1] == len(runs), (kind, err)
      break
    interrupted += 1
    assert process.returncode == 130, (kind, err)
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


def _reference(tmp: pathlib.Path, text: str, *args: str) -> pathlib.Path:
  """The uninterrupted study of `text`, sequential, in this process (no
  TensorFlow import of its own; the runs it is compared with play in others)."""
  (tmp / "proof.yaml").write_text(text)
  assert cli.main(["run", str(tmp / "proof.yaml"), *args, "--logdir", str(tmp / "runs"),
                   "--no-progress"]) == 0
  return tmp / "runs" / "proof"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> pathlib.Path:
  return _reference(tmp_path_factory.mktemp("reference"), CONFIG)


@pytest.fixture(scope="module")
def small_reference(tmp_path_factory) -> pathlib.Path:
  return _reference(tmp_path_factory.mktemp("small_reference"), SMALL)


@pytest.mark.slow
def test_a_study_interrupted_at_three_moments_equals_the_uninterrupted_one(
    small_reference, tmp_path):
  study = _interrupted_study(tmp_path, ["start-up", "mid-run", "between runs"], seed=0,
                             text=SMALL, runs=SMALL_RUNS)
  _assert_equal_studies(study, small_reference, SMALL_RUNS)


@pytest.mark.long
@pytest.mark.slow
def test_a_study_interrupted_at_ten_random_moments_equals_the_uninterrupted_one(
    reference, tmp_path):
  rng = random.Random(10)
  moments = [rng.choice(["start-up", "mid-run", "between runs"]) for _ in range(10)]
  study = _interrupted_study(tmp_path, moments, seed=10)
  _assert_equal_studies(study, reference)


# `-m long`: the default run's killed-player test plays a study on two jobs and
# checks it against the sequential one.
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("variant", [
    "sgd",  # 3 runs: two at once, then the third
    None])  # all 12
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


def _players(study_pid: int) -> list[int]:
  """The study's player processes (its children; they live as long as it does)."""
  found = subprocess.run(["pgrep", "-P", str(study_pid)], capture_output=True, text=True).stdout
  return [int(pid) for pid in found.split()]


def _playing(pid: int) -> pathlib.Path | None:
  """The run directory a player plays now (its fd 1 is that run's output.log)."""
  try:
    return pathlib.Path(os.readlink(f"/proc/{pid}/fd/1")).parent
  except OSError:
    return None


@pytest.mark.slow
def test_two_jobs_go_on_when_a_player_is_killed_and_its_run_resumes(small_reference, tmp_path):
  (tmp_path / "proof.yaml").write_text(SMALL)
  study = tmp_path / "runs" / "proof"
  runs = [run for run in SMALL_RUNS if run.startswith("sgd-")]
  process = _fedsim(str(tmp_path / "proof.yaml"), "--logdir", str(tmp_path / "runs"),
                    "--jobs", "2", "--variant", "sgd")
  try:
    deadline = time.monotonic() + TIMEOUT_S
    victim, spared, players = None, set(), []
    while process.poll() is None and time.monotonic() < deadline and victim is None:
      players = players if len(players) == 2 else _players(process.pid)
      started = False  # a player plays a run of ours: watch closely from then on
      for pid in players:
        run_dir = _playing(pid)
        if run_dir is None or run_dir.name not in runs or run_dir in spared:
          continue
        started = True
        logged = _lines(run_dir / "metrics.csv")
        if logged < 2:
          continue  # not yet mid-run: no round logged
        # Frozen, its run is mid-run for sure or already completed (3 short rounds):
        # killed in the first case (once a checkpoint is on disk: the background
        # writer may still be writing round 1's), let go in the second.
        os.kill(pid, signal.SIGSTOP)
        if read_status(run_dir)[0] == "completed" or _lines(run_dir / "metrics.csv") > 3:
          spared.add(run_dir)
        if run_dir in spared or intact_checkpoints(run_dir)[0] is None:
          os.kill(pid, signal.SIGCONT)
          continue
        os.kill(pid, signal.SIGKILL)
        victim = (run_dir.name, pid)
        break
      # Until then the players import TensorFlow for seconds: polling them (a pgrep
      # each time) every millisecond took a core from the suite. From then on a run's
      # three short rounds can all be logged within 50 ms (one CI run spared all).
      time.sleep(0.001 if started else 0.05)
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
  others = [r for r in runs if r != run]
  assert [(study / r / "status").read_text().split("\n")[0] for r in others] == ["completed"]
  resumed = _fedsim("--resume", str(study), "--jobs", "2")
  _, err = resumed.communicate(timeout=TIMEOUT_S)
  assert resumed.returncode == 0, err
  assert "resuming" in (study / run / "output.log").read_text()
  _assert_equal_studies(study, small_reference, runs)
