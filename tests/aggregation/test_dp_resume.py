"""A DP + 8-bit run on the inprocess runtime, resumed from its checkpoint, draws
the noise (and adapts the clip) exactly as an uninterrupted run does."""

from __future__ import annotations

import numpy as np
import pytest

import fedsim

CONFIG = {
    "name": "dp_resume", "seed": 4, "rounds": 4, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 6, "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg", "client_weighting": "uniform"},
    "aggregation": [{"name": "dp_gaussian", "noise_multiplier": 0.8, "clip": 0.5,
                     "adaptive": True, "clipped_count_stddev": 1.0},
                    {"name": "encode", "encoder": "uniform", "bits": 8, "min_elements": 100}],
    "runtime": {"name": "inprocess"},
    "eval": {"every": 1}, "checkpoint": {"every": 2},
}
WALL_CLOCK = ("round_seconds",)


def _rows(result):
  return [{k: v for k, v in row.items() if k not in WALL_CLOCK} for row in result.metrics]


@pytest.mark.slow
def test_resumed_dp_run_equals_the_uninterrupted_one(tmp_path):
  whole = fedsim.run(CONFIG, logdir=tmp_path / "whole", progress=False)
  half = fedsim.run(CONFIG, ["rounds=2"], logdir=tmp_path / "parts", progress=False)
  resumed = fedsim.run(CONFIG, logdir=tmp_path / "parts", progress=False, resume=half.run_dir)
  assert resumed.run_dir == half.run_dir
  assert _rows(resumed) == _rows(whole)
  assert [row["privacy/epsilon"] for row in _rows(whole)] == sorted(
      row["privacy/epsilon"] for row in _rows(whole))
  for got, want in zip(resumed.final_weights, whole.final_weights):
    np.testing.assert_array_equal(got, want)
