"""A real 2-seed, 1-round experiment through `fedsim.run` and `fedsim compare`."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from scipy import stats

import fedsim
from fedsim.reporting.compare import compare_seeds

CONFIG = {
    "name": "seeded", "rounds": 1, "clients_per_round": 2, "seeds": [0, 1],
    "data": {"name": "synthetic", "num_clients": 6, "dimension": 8, "num_classes": 3},
    "model": {"name": "logistic"},
    "eval": {"federated": True},
}


@pytest.mark.slow
def test_two_seeds_run_apart_and_compare_as_one_variant(tff_runtime, tmp_path):
  results = fedsim.run(CONFIG, logdir=tmp_path, progress=False)
  assert list(results) == ["seed0", "seed1"]
  accuracy = []
  for seed, name in enumerate(results):
    run_dir = results[name].run_dir
    assert run_dir.name == name
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == seed
    final = results[name].final
    accuracy.append(final["eval/accuracy"])
    # Per-client evaluation on LEAF synthetic's own per-client test splits.
    assert final["eval_clients/num_clients"] == 2
    assert (final["eval_clients/accuracy_p10"] <= final["eval_clients/accuracy_p50"]
            <= final["eval_clients/accuracy_p90"])
  # Different seeds: different data and initial weights.
  assert not np.array_equal(results["seed0"].final_weights[0], results["seed1"].final_weights[0])
  [row] = compare_seeds(tmp_path / "seeded")
  assert row["variant"] == "seeded" and row["seeds"] == [0, 1]
  low, high = stats.t.interval(0.95, 1, loc=np.mean(accuracy), scale=stats.sem(accuracy))
  assert row["eval/accuracy"] == pytest.approx(np.mean(accuracy))
  assert row["eval/accuracy_interval"] == pytest.approx((high - low) / 2)
