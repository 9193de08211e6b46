"""Runs on the simulated network: round time from the bits the run sends, late uploads,
and the TensorBoard curve of accuracy against simulated time."""

from __future__ import annotations

import numpy as np
import pytest

import fedsim
from tests.resume.events import steps_by_tag

UP_BPS = 10_000.0
BASE = {
    "name": "network", "seed": 2, "rounds": 3, "clients_per_round": 3, "backup_clients": 1,
    "data": {"name": "digits", "num_clients": 8, "partition": "iid", "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg"},
    # Communication-bound: a fast downlink, no latency, next to no compute.
    "system": {"seconds_per_example": 1e-9, "late_uploads": "sent",
               "profiles": {"down_bps": {"median": 1e15}, "up_bps": {"median": UP_BPS}}},
}


@pytest.mark.slow
def test_8bit_uploads_shorten_rounds_by_the_measured_bits_ratio(tff_runtime, tmp_path):
  config = dict(BASE, variants={"none": {}, "u8": {"compression": {"aggregation": {
      "encoder": "uniform", "bits": 8, "min_elements": 100}}}})
  results = fedsim.run(config, logdir=tmp_path)
  rounds = {}
  for name, result in results.items():
    rows = result.metrics
    per_client = rows[0]["aggregate_bits_per_client"]
    # The round ends with the 3rd of 4 identical uploads, after a few nanoseconds of compute.
    np.testing.assert_allclose([r["round_simulated_seconds"] for r in rows],
                               per_client / UP_BPS, rtol=1e-6)
    rounds[name] = (rows[0]["round_simulated_seconds"], per_client)
    for row in rows:  # The late 4th client sent its upload too.
      assert row["clients/late"] == 1 and row["late_upload_bits"] == per_client
      assert row["aggregate_bits"] == 4 * per_client
    steps = steps_by_tag(result.run_dir)["eval/accuracy_by_simulated_ms"]
    assert steps == [round(r["simulated_seconds"] * 1000) for r in rows]
  (t_none, bits_none), (t_u8, bits_u8) = rounds["none"], rounds["u8"]
  assert bits_none / bits_u8 > 2.5
  np.testing.assert_allclose(t_none / t_u8, bits_none / bits_u8, rtol=1e-6)


@pytest.mark.slow
def test_simulated_time_curve_has_a_point_per_evaluation_when_no_time_passes(
    tff_runtime, tmp_path):
  # Every client fails: no round takes simulated time, yet each evaluation is a point
  # (a device model, so the run has the curve).
  config = dict(BASE, system={"dropout_probability": 0.99, "speed": "lognormal"},
                backup_clients=0)
  result = fedsim.run(config, logdir=tmp_path)
  assert [r["simulated_seconds"] for r in result.metrics] == [0.0, 0.0, 0.0]
  assert steps_by_tag(result.run_dir)["eval/accuracy_by_simulated_ms"] == [0, 1, 2]
