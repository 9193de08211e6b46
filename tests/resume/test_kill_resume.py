"""The proof: a run SIGKILLed mid-way and resumed equals an uninterrupted run.

Runs `fedsim run` in a subprocess, kills it once metrics.csv has a round past
a checkpoint, resumes it with a second `fedsim run`, and compares metrics.csv,
final_model.npz and TensorBoard with an uninterrupted run of the same config.
Elastic averaging has the most state: server state plus one local model per
client on disk. FedAvg with error feedback on a top-k upload keeps each
client's residual on disk instead, which a resumed run must add back exactly.
"""

from __future__ import annotations

import csv
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from fedsim import cli
from tests.resume.events import steps_by_tag
from tests.resume.final_models import assert_same_final_model

ROUNDS = 6
HEADER = f"""
name: proof
seed: 5
rounds: {ROUNDS}
clients_per_round: 3
data: {{name: digits, num_clients: 6, partition: dirichlet, alpha: 0.5, batch_size: 16}}
model: {{name: logistic}}
eval: {{every: 1}}
checkpoint: {{every: 2, keep: 2}}
"""
# One variant each, so the run directory is <name>/<variant>.
CONFIGS = {
    "easgd": """
algorithm:
  name: easgd
  communication_period: 3
  moving_rate: 0.3
  client_optimizer: {name: sgd, learning_rate: 0.1, momentum: 0.5}
system: {speed: lognormal, sigma: 0.5}
# On TFF's worker: `auto` would pick inprocess, which dadaquant_inprocess runs.
runtime: {name: local}
variants: {easgd: {}}
""",
    # Top-20 of the 640-element kernel: most of each update stays in the residual.
    "topk_ef": """
algorithm: {name: fedavg}
aggregation: [{name: encode, encoder: topk, k: 20, min_elements: 100, error_feedback: true}]
variants: {topk_ef: {}}
""",
    # The same on the compiled runtime, whose client states live in memory between
    # checkpoints: the kill loses the rounds after the checkpoint, the resume replays them.
    "topk_ef_inprocess": """
algorithm: {name: fedavg}
aggregation: [{name: encode, encoder: topk, k: 20, min_elements: 100, error_feedback: true}]
runtime: {name: inprocess, device: cpu}
variants: {topk_ef_inprocess: {}}
""",
    # A controller's state (DAdaQuant's smoothed loss and level) is server
    # state: restored from the checkpoint, it decides every resumed round's
    # per-client bits as the uninterrupted run did.
    "dadaquant_inprocess": """
algorithm: {name: fedavg}
aggregation: [{name: encode, encoder: uniform, min_elements: 100, bits: {controller: dadaquant, initial: 3, max: 8, patience: 2}}]
runtime: {name: inprocess, device: cpu}
variants: {dadaquant_inprocess: {}}
""",
}
WALL_CLOCK = ("round_seconds",)


def _fedsim(*args: str) -> subprocess.Popen:
  env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.Popen([sys.executable, "-m", "fedsim.cli", "run", *args, "--no-progress"],
                          env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _rows(run_dir: pathlib.Path) -> list[dict[str, str]]:
  with open(run_dir / "metrics.csv", newline="") as f:
    return [{k: v for k, v in row.items() if k not in WALL_CLOCK} for row in csv.DictReader(f)]


def _wait_for_round(process: subprocess.Popen, metrics: pathlib.Path, round_num: int) -> None:
  deadline = time.monotonic() + 240
  while time.monotonic() < deadline:
    if process.poll() is not None:
      raise AssertionError(f"the run ended before round {round_num}: {process.stderr.read()}")
    if metrics.exists() and metrics.read_text().count("\n") > round_num:  # header + rows
      return
    time.sleep(0.05)
  raise AssertionError(f"round {round_num} not reached in time")


# Each variant starts three `fedsim run` processes (~90 s on a loaded 2-core CI
# machine). easgd keeps the kill and its rewind of on-disk client states in every
# run (on `local`, its worker killed with it); the others are `-m long`: `auto`
# runs topk_ef on inprocess too, test_error_feedback_resume.py's fedavg-topk
# resume keeps the residuals' checkpoint bit for bit, and test_controlled_rounds'
# step resume a controller's state (its decisions depend on it), while
# test_live_runs SIGKILLs inprocess runs in every run.
LONG = ("topk_ef", "topk_ef_inprocess", "dadaquant_inprocess")


@pytest.mark.slow
@pytest.mark.parametrize("variant", [
    pytest.param(v, marks=pytest.mark.long if v in LONG else ()) for v in sorted(CONFIGS)])
def test_sigkilled_run_resumes_to_the_uninterrupted_result(tmp_path, variant):
  config = tmp_path / "proof.yaml"
  config.write_text(HEADER + CONFIGS[variant])
  run_dir, ref_dir = tmp_path / "runs/proof" / variant, tmp_path / "reference/proof" / variant
  killed = _fedsim(str(config), "--logdir", str(tmp_path / "runs"))
  try:
    # Round 3 is past the checkpoint of round 2, so the kill lands where
    # metrics.csv, TensorBoard and client states are ahead of the checkpoint.
    _wait_for_round(killed, run_dir / "metrics.csv", 3)
    killed.send_signal(signal.SIGKILL)
  finally:
    killed.kill()
    killed.communicate()
  assert (run_dir / "status").read_text().startswith("running")

  resumed = _fedsim(str(config), "--logdir", str(tmp_path / "runs"), "--resume")
  out, err = resumed.communicate(timeout=600)
  assert resumed.returncode == 0, err
  assert f"resuming {run_dir} after round" in out
  # The uninterrupted run in this process: no TensorFlow import of its own.
  assert cli.main(["run", str(config), "--logdir", str(tmp_path / "reference"),
                   "--no-progress"]) == 0

  assert (run_dir / "status").read_text().startswith("completed")
  rows = _rows(run_dir)
  assert [r["round"] for r in rows] == [str(r) for r in range(1, ROUNDS + 1)]
  assert rows == _rows(ref_dir)  # every metric, bit for bit (repr of floats)
  if variant.startswith("topk_ef"):  # the residuals were really there to restore
    assert all(float(r["error_feedback/residual_norm"]) > 0 for r in rows)
  clients = (run_dir / "clients.csv").read_text()
  assert clients == (ref_dir / "clients.csv").read_text()  # rewound: each round once
  header = "round,sampled,aggregated,staleness"
  if variant.startswith("dadaquant"):  # each client's bits and upload size
    header += ",value,upload_bits"
    assert (run_dir / "checkpoints/round_6/control.json").is_file()
  assert clients.splitlines()[0] == header
  assert [line.split(",")[0] for line in clients.splitlines()[1:]] == [
      str(r) for r in range(1, ROUNDS + 1)]
  # The reference ran in this process, after other models.
  assert_same_final_model(run_dir / "final_model.npz", ref_dir / "final_model.npz")
  steps = steps_by_tag(run_dir)
  for tag in ("train/loss", "eval/accuracy", "sent/cumulative_aggregate_bits"):
    assert steps[tag] == list(range(1, ROUNDS + 1)), tag
  assert steps["final/eval/accuracy"] == [ROUNDS]
  ref_steps = steps_by_tag(ref_dir)
  if variant == "easgd":   # system.speed: the only one with a device model, so a clock
    time_steps = steps["eval/accuracy_by_simulated_ms"]
    assert time_steps == ref_steps["eval/accuracy_by_simulated_ms"]
    assert len(time_steps) == ROUNDS
  else:
    assert "eval/accuracy_by_simulated_ms" not in steps | ref_steps
  bits_steps = steps["eval/accuracy_by_bits"]
  assert bits_steps == ref_steps["eval/accuracy_by_bits"]
  assert len(bits_steps) == ROUNDS
  assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["round_4", "round_6"]
  if not variant.startswith("dadaquant"):  # its clients keep no state
    assert (sorted(p.name for p in (run_dir / "client_states").iterdir())
            == sorted(p.name for p in (ref_dir / "client_states").iterdir()))
  else:  # per-client bits: DAdaQuant gave clients of one round different levels
    values = [line.split(",")[4].split() for line in clients.splitlines()[1:]]
    assert any(len(set(v)) > 1 for v in values)
