"""A FedBuff run SIGKILLed mid-way resumes to the uninterrupted result: the clients
in flight (with the updates they computed on older model versions), the event clock
and the dispatch counters are part of the checkpoint."""

from __future__ import annotations

import csv
import io
import signal

import numpy as np
import pytest

from tests.resume.events import steps_by_tag
from tests.resume.test_kill_resume import _fedsim, _rows, _wait_for_round

ROUNDS = 6
CONFIG = f"""
name: proof
seed: 3
rounds: {ROUNDS}
clients_per_round: 2
data: {{name: digits, num_clients: 8, partition: dirichlet, alpha: 0.5, batch_size: 16}}
model: {{name: logistic}}
algorithm: {{name: fedbuff, concurrency: 4, max_staleness: 1, local_steps: 2}}
system:
  speed: lognormal
  sigma: 0.5
  profiles: {{compute_speed: {{median: 1.0, sigma: 0.5}}, up_bps: {{median: 1.0e5, sigma: 0.5}}}}
eval: {{every: 1}}
checkpoint: {{every: 2, keep: 2}}
variants: {{fedbuff: {{}}}}
"""


@pytest.mark.slow
def test_a_fedbuff_run_resumed_from_its_checkpoint_equals_the_uninterrupted_one(tmp_path):
  """In this process: 3 rounds, then 3 more from their checkpoint, against 6 straight.
  The clients in flight at round 3 are in the checkpoint or the result differs."""
  import fedsim
  config = str(tmp_path / "proof.yaml")  # fedsim's YAML reader, as the CLI's
  (tmp_path / "proof.yaml").write_text(CONFIG.replace("variants: {fedbuff: {}}\n", ""))
  whole = fedsim.run(config, logdir=tmp_path / "whole", progress=False)
  half = fedsim.run(config, ["rounds=3"], logdir=tmp_path / "parts", progress=False)
  assert int(half.metrics[-1]["clients/in_flight"]) > 0  # something to carry over
  resumed = fedsim.run(config, logdir=tmp_path / "parts", progress=False,
                       resume=half.run_dir)
  assert resumed.run_dir == half.run_dir
  rows = _rows(whole.run_dir)
  assert [r["round"] for r in rows] == [str(r) for r in range(1, ROUNDS + 1)]
  assert _rows(resumed.run_dir) == rows
  assert max(float(r["staleness/max"]) for r in rows) > 0  # really asynchronous
  for got, want in zip(resumed.final_weights, whole.final_weights, strict=True):
    np.testing.assert_array_equal(got, want)
  clients = (resumed.run_dir / "clients.csv").read_text()
  assert clients == (whole.run_dir / "clients.csv").read_text()
  _check_dispatch_bookkeeping(list(csv.DictReader(io.StringIO(clients))), rows)


@pytest.mark.slow
# Three `fedsim run` processes (~85 s): `-m long`. The test above keeps the
# in-flight clients' checkpoint in every run, and test_kill_resume.py's easgd
# and dadaquant_inprocess keep a SIGKILL's rewind of what followed it.
@pytest.mark.long
def test_sigkilled_fedbuff_run_resumes_to_the_uninterrupted_result(tmp_path):
  config = tmp_path / "proof.yaml"
  config.write_text(CONFIG)
  reference = _fedsim(str(config), "--logdir", str(tmp_path / "reference"))
  killed = _fedsim(str(config), "--logdir", str(tmp_path / "runs"))
  try:
    # Round 3 is past the checkpoint of round 2: clients dispatched after it are lost.
    _wait_for_round(killed, tmp_path / "runs/proof/fedbuff/metrics.csv", 3)
    killed.send_signal(signal.SIGKILL)
  finally:
    killed.kill()
    killed.communicate()

  resumed = _fedsim(str(config), "--logdir", str(tmp_path / "runs"), "--resume")
  out, err = resumed.communicate(timeout=600)
  assert resumed.returncode == 0, err
  assert "resuming" in out
  out, err = reference.communicate(timeout=600)
  assert reference.returncode == 0, err

  run_dir, ref_dir = tmp_path / "runs/proof/fedbuff", tmp_path / "reference/proof/fedbuff"
  rows = _rows(run_dir)
  assert [r["round"] for r in rows] == [str(r) for r in range(1, ROUNDS + 1)]
  assert rows == _rows(ref_dir)  # every metric, bit for bit (repr of floats)
  assert max(float(r["staleness/max"]) for r in rows) > 0  # really asynchronous
  with np.load(run_dir / "final_model.npz") as got, np.load(ref_dir / "final_model.npz") as want:
    for name in want.files:
      np.testing.assert_array_equal(got[name], want[name])
  assert (steps_by_tag(run_dir)["eval/accuracy_by_simulated_ms"]
          == steps_by_tag(ref_dir)["eval/accuracy_by_simulated_ms"])
  clients = (run_dir / "clients.csv").read_text()
  assert clients == (ref_dir / "clients.csv").read_text()  # rewound: each update once
  _check_dispatch_bookkeeping(list(csv.DictReader(io.StringIO(clients))), rows)


def _check_dispatch_bookkeeping(clients, metrics):
  """clients.csv against the buffer's rules: an update applied in server update k
  with staleness s was computed on version k-1-s, so its client downloaded it while
  update k-s was filling and was not dispatched again until it arrived (one
  client is in flight at most once); K = 2 updates per row; the counts agree with
  metrics.csv, and dispatches minus arrivals are the clients in flight."""
  sampled = [row["sampled"].split() for row in clients]
  in_flight = 0
  for k, (row, m) in enumerate(zip(clients, metrics), start=1):
    aggregated = row["aggregated"].split()
    staleness = [int(s) for s in row["staleness"].split()]
    assert len(sampled[k - 1]) == int(m["clients/dispatched"])
    assert len(aggregated) == len(staleness) == int(m["clients/aggregated"]) == 2
    assert max(staleness) == int(m["staleness/max"])
    for cid, s in zip(aggregated, staleness):
      assert 0 <= s <= 1, (k, cid, s)  # max_staleness: 1
      assert cid in sampled[k - 1 - s], (k, cid, s)
      assert all(cid not in sampled[j - 1] for j in range(k - s + 1, k)), (k, cid, s)
    in_flight += len(sampled[k - 1]) - len(aggregated) - int(m["staleness/dropped"]) - int(
        m["clients/failed"])
    assert in_flight == int(m["clients/in_flight"]), k
