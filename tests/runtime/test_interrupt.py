"""Ctrl-C on a real `fedsim run`: exit 130 within 10 s, status interrupted, no process left.

Each trial starts `fedsim run` in its own session with SIGINT at its default
(as a terminal starts a job), waits until the run is under way, sleeps a
seeded random 0-3 s (start-up compile, a round, evaluation, a checkpoint) and
sends SIGINT to the whole process group, as a terminal's Ctrl-C does. No
process the run started may be left (a TFF worker; on `ray`, a private
instance's GCS, raylet, agents and actors). `ray` trials are `long` (each
starts a Ray instance); bench/signal_trials.py runs many trials under load.
FEDSIM_INTERRUPT_TRIALS (default 3) sets the trials per runtime; run 20 by hand:

    FEDSIM_INTERRUPT_TRIALS=20 uv run pytest tests/runtime/test_interrupt.py -s
"""

from __future__ import annotations

import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.chaos.processes import MARKER, kill_marked, left_after

REPO = pathlib.Path(__file__).parents[2]
TRIALS = int(os.environ.get("FEDSIM_INTERRUPT_TRIALS", "2"))  # more: set the variable
START_TIMEOUT_S = 300  # TF (and Ray) import and the first compile on a busy 2-core machine
EXIT_TIMEOUT_S = 10
CONFIG = """
name: interrupt
seed: 3
rounds: 100000
clients_per_round: 3
data: {name: digits, num_clients: 6, partition: iid, batch_size: 32}
model: {name: logistic}
algorithm: {name: fedavg}
eval: {every: 2}
checkpoint: {every: 3, keep: 1}
"""
RUNTIMES = {"local": "{name: local}", "inprocess": "{name: inprocess}",
            "ray": "{name: ray, address: local}"}  # a private instance


def _status(run_dir: pathlib.Path | None) -> str:
  try:
    return (run_dir / "status").read_text().split("\n")[0]
  except (OSError, TypeError):
    return ""


@pytest.mark.slow
# One trial per runtime in every run; the others (other random delays) on `-m long`.
@pytest.mark.parametrize("trial", [pytest.param(t, marks=pytest.mark.long if t else ())
                                   for t in range(TRIALS)])
@pytest.mark.parametrize("runtime", ["local", "inprocess",
                                     pytest.param("ray", marks=pytest.mark.long)])
def test_ctrl_c_ends_the_run_promptly(runtime, trial, tmp_path):
  config = tmp_path / "interrupt.yaml"
  config.write_text(CONFIG + f"runtime: {RUNTIMES[runtime]}\n")
  marker = uuid.uuid4().hex
  env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", **{MARKER: marker})
  proc = subprocess.Popen(
      [sys.executable, "-m", "fedsim.cli", "run", str(config), "--logdir",
       str(tmp_path / "runs"), "--no-progress"],
      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=env, start_new_session=True,
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  try:
    run_dir = None
    deadline = time.monotonic() + START_TIMEOUT_S
    while _status(run_dir) != "running":
      assert proc.poll() is None, proc.communicate()
      assert time.monotonic() < deadline, "the run never started"
      runs = [p.parent for p in (tmp_path / "runs" / "interrupt").glob("*/config.yaml")]
      run_dir = runs[0] if runs else None
      time.sleep(0.05)
    delay = random.Random(f"{runtime}-{trial}").uniform(0.0, 3.0)
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    try:
      out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      pytest.fail(f"still running {EXIT_TIMEOUT_S} s after Ctrl-C (sent {delay:.2f} s"
                  f" after the run started)")
    took = time.monotonic() - sent
    print(f"\n{runtime} trial {trial}: Ctrl-C {delay:.2f} s into the run, exited"
          f" {proc.returncode} after {took:.2f} s")
    assert proc.returncode == 130, err
    # The whole study's command, as this process was started (`python -m fedsim.cli`).
    assert re.search(rf"fedsim: interrupted; resume with: \S*python\S* -m fedsim\.cli run"
                     rf" --resume {re.escape(str(run_dir.parent))}\n$", err), err
    assert "Traceback" not in err, err
    assert _status(run_dir) == "interrupted"
    assert left_after(marker, 5) == []  # PDEATHSIG kills are asynchronous
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()
    kill_marked(marker)
