"""`fedsim run` on a private Ray instance (`runtime: {name: ray, address: local}`), attacked.

* SIGINT to the driver during start-up (Ray starting, actors building): exit
  130, one line with the resume command, the run not started, no Ray process left.
* SIGTERM to the driver mid-run: exit 143, status `interrupted`, nothing left.
* SIGKILL to the driver mid-run: no Ray process of that run left (the
  instance's GCS and raylet die with the driver by PDEATHSIG, its agents and
  actors by fedsim's watcher, `fedsim.runtime.cluster.lifetime`), and
  `--resume` completes to the uninterrupted result.
* SIGKILL to one actor mid-run: Ray restarts it, its chunk reruns, and the run
  completes to the uninterrupted result.

"The uninterrupted result" is an `inprocess` run of the same config: the
cluster's two chunks merge to it to float rounding (tests/runtime/test_cluster.py).
Each test starts a Ray instance (about a minute on two busy cores): all `slow`.
"""

from __future__ import annotations

import csv
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from fedsim import cli
from tests.chaos.processes import MARKER, kill_marked, left_after, marked

REPO = pathlib.Path(__file__).parents[2]
ROUNDS = 30
CONFIG = f"""
name: rayfault
seed: 7
rounds: {ROUNDS}
clients_per_round: 4
data: {{name: digits, num_clients: 8, partition: iid, batch_size: 32}}
model: {{name: logistic}}
algorithm: {{name: fedavg, client_optimizer: {{name: sgd, learning_rate: 0.1}}}}
eval: {{every: 5}}
checkpoint: {{every: 2, keep: 2}}
"""
RAY = "runtime: {name: ray, address: local, workers: 2, device: cpu}\n"
INPROCESS = "runtime: {name: inprocess, device: cpu}\n"
START_TIMEOUT_S = 300  # TensorFlow, Ray and two actors on a busy 2-core machine


class Run:
  """One `fedsim run` subprocess in its own session, its processes marked."""

  def __init__(self, tmp_path: pathlib.Path, runtime: str, *extra: str):
    self.config = tmp_path / f"rayfault_{'ray' if runtime == RAY else 'inprocess'}.yaml"
    self.config.write_text(CONFIG + runtime)
    self.logdir = tmp_path / "runs"
    self.marker = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
               **{MARKER: self.marker})
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "fedsim.cli", "run", str(self.config), "--logdir",
         str(self.logdir), "--no-progress", *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal's job

  @property
  def run_dir(self) -> pathlib.Path | None:
    found = sorted((self.logdir / "rayfault").glob("*"))
    return found[0] if found else None

  def rounds_logged(self) -> int:
    try:
      return (self.run_dir / "metrics.csv").read_text().count("\n") - 1
    except (OSError, TypeError):
      return 0

  def wait_until(self, ready, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
      assert self.proc.poll() is None, (f"ended before {what}", self.proc.communicate())
      assert time.monotonic() < deadline, f"{what}: not within {START_TIMEOUT_S} s"
      time.sleep(0.05)

  def finish(self, timeout: float = 600) -> tuple[int, str, str]:
    out, err = self.proc.communicate(timeout=timeout)
    return self.proc.returncode, out, err

  def cleanup(self) -> None:
    if self.proc.poll() is None:
      os.killpg(self.proc.pid, signal.SIGKILL)
      self.proc.communicate()
    kill_marked(self.marker)


@pytest.fixture
def runs(tmp_path):
  """start(runtime, *args) -> a Run; every run killed and swept at the end."""
  started = []

  def start(runtime: str, *extra: str) -> Run:
    started.append(Run(tmp_path, runtime, *extra))
    return started[-1]

  yield start
  for run in started:
    run.cleanup()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """final_model.npz of the config run without faults (on `inprocess`)."""
  run = Run(tmp_path_factory.mktemp("reference"), INPROCESS)
  try:
    code, _, err = run.finish()
    assert code == 0, err
    with np.load(run.run_dir / "final_model.npz") as model:
      return {name: model[name] for name in model.files}
  finally:
    run.cleanup()


def _assert_completed_as(run_dir: pathlib.Path, want: dict) -> None:
  assert (run_dir / "status").read_text().startswith("completed")
  with open(run_dir / "metrics.csv", newline="") as f:
    assert [row["round"] for row in csv.DictReader(f)] == [str(r) for r in range(1, ROUNDS + 1)]
  with np.load(run_dir / "final_model.npz") as got:
    assert sorted(got.files) == sorted(want)
    for name in want:
      np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def _ray_processes(run: Run, kind: str) -> list[int]:
  return [pid for pid, command in marked(run.marker) if kind in command]


# CI time: each test here starts a private Ray instance and real `fedsim run`
# processes (40-90 s on a quiet 2-core machine), so the whole module is `-m long`
# (the default run stayed over 20 minutes with two of them). Every run keeps the
# parts they rest on: tests/runtime/test_signals.py and test_early_signals.py
# the signal handling, tests/runtime/test_cluster.py a worker that dies
# mid-round, tests/resume/test_kill_resume.py a SIGKILLed driver's resume.
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("moment", ["raylet", "ray::ClientWorker"])
def test_sigint_during_start_up_is_one_line_and_leaves_nothing(runs, moment, capsys):
  """SIGINT once Ray's raylet runs (ray.init under way) or once the actors are
  building (each imports TensorFlow): the study has prepared the run's directory
  by then, which `fedsim status` lists as not started, and the line says how to
  resume the study."""
  run = runs(RAY)
  run.wait_until(lambda: _ray_processes(run, moment), moment)
  os.killpg(run.proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole job
  code, _, err = run.finish(timeout=60)
  assert code == 130, err
  assert re.fullmatch(r"fedsim: interrupted; resume with: \S+ -m fedsim.cli run --resume "
                      + re.escape(str(run.logdir / "rayfault")) + "\n", err), err
  assert cli.main(["status", str(run.run_dir)]) == 0
  assert capsys.readouterr().out.startswith(f"{run.run_dir}: not started, round 0 of {ROUNDS}")
  assert left_after(run.marker, 5) == []


@pytest.mark.slow
@pytest.mark.long
def test_sigterm_mid_run_exits_143_interrupted_and_leaves_nothing(runs):
  run = runs(RAY)
  run.wait_until(lambda: run.rounds_logged() >= 3, "round 3")
  run.proc.send_signal(signal.SIGTERM)  # ray.init had replaced this handler: exit 15
  code, _, err = run.finish(timeout=60)
  assert code == 143, err
  assert "Traceback" not in err and "Exception ignored" not in err, err
  assert (run.run_dir / "status").read_text().split("\n")[0] == "interrupted"
  assert left_after(run.marker, 5) == []


@pytest.mark.slow
@pytest.mark.long
def test_a_sigkilled_driver_leaves_no_ray_process_and_resumes(runs, uninterrupted):
  run = runs(RAY)
  run.wait_until(lambda: run.rounds_logged() >= 3, "round 3")
  assert _ray_processes(run, "raylet") and _ray_processes(run, "ray::ClientWorker")
  run.proc.send_signal(signal.SIGKILL)
  run.finish(timeout=60)
  # Ray's agents used to stay about a minute, trying to report to the dead GCS.
  assert left_after(run.marker, 5) == []
  run_dir = run.run_dir
  resumed = runs(RAY, "--resume", str(run_dir))
  code, out, err = resumed.finish()
  assert code == 0, err
  assert f"resuming {run_dir} after round" in out
  _assert_completed_as(run_dir, uninterrupted)
  assert left_after(resumed.marker, 5) == []


@pytest.mark.slow
@pytest.mark.long
def test_an_actor_killed_mid_run_is_restarted_and_the_run_completes(runs, uninterrupted):
  run = runs(RAY)
  run.wait_until(lambda: run.rounds_logged() >= 2, "round 2")
  actors = _ray_processes(run, "ray::ClientWorker")
  assert len(actors) == 2
  os.kill(actors[0], signal.SIGKILL)
  assert run.proc.poll() is None and run.rounds_logged() < ROUNDS  # it was mid-run
  code, _, err = run.finish()
  assert code == 0, err
  _assert_completed_as(run.run_dir, uninterrupted)
  assert left_after(run.marker, 5) == []
