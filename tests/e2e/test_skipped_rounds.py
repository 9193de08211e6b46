"""Skipped rounds through the whole run loop: the model does not move, nothing is
uploaded, and a differentially private run spends no privacy on them."""

from __future__ import annotations

import numpy as np
import pytest

import fedsim

CONFIG = {
    "name": "skips", "seed": 1, "rounds": 8, "clients_per_round": 3, "backup_clients": 2,
    "data": {"name": "digits", "num_clients": 6, "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg", "client_weighting": "uniform"},
    # 5 sampled, each fails with probability 0.5; a round needs 3 reports.
    "system": {"dropout_probability": 0.5, "min_clients": 3},
    "aggregation": [{"name": "dp_gaussian", "noise_multiplier": 1.0, "clip": 1.0}],
    "runtime": {"name": "inprocess"},
}


@pytest.mark.slow
def test_skipped_rounds_leave_the_model_and_the_privacy_budget_alone(tmp_path):
  seen = []
  result = fedsim.run(CONFIG, logdir=tmp_path, progress=False,
                      on_round=lambda r, metrics, info: seen.append((metrics, info)))
  skipped = [m["round_skipped"] == 1 for m, _ in seen]
  assert any(skipped) and not all(skipped), skipped  # seed 1 gives both kinds
  per_client = seen[0][0]["broadcast_bits_per_client"]
  released = 0
  previous = None
  for metrics, info in seen:
    if metrics["round_skipped"]:
      assert metrics["aggregate_bits"] == 0 and info.aggregated == ()
      assert "train/loss" not in metrics
      if previous is not None:
        for got, want in zip(info.weights, previous):
          np.testing.assert_array_equal(got, want)
    else:
      released += 1
      assert metrics["aggregate_bits"] > 0 and len(info.aggregated) == 3
      if previous is not None:
        assert any(not np.array_equal(a, b) for a, b in zip(info.weights, previous))
    assert metrics["broadcast_bits"] == per_client * len(info.sampled)  # sent either way
    expected = 0.0 if released == 0 else result_ledger_epsilon(released)
    assert metrics["privacy/epsilon"] == pytest.approx(expected, rel=1e-12)
    previous = info.weights


def result_ledger_epsilon(rounds: int) -> float:
  # Noise multiplier 1.0 is 0.5 of the replace-one sensitivity (2 clips).
  import dp_accounting
  event = dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
      6, 5, dp_accounting.GaussianDpEvent(0.5)), rounds)
  accountant = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  return accountant.compose(event).get_epsilon(1e-5)
