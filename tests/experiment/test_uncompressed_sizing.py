"""The uncompressed reference size is compiled once for all encoders of a sweep."""

from __future__ import annotations

import pytest

from fedsim.experiment import simulation
from fedsim.experiment.config.loader import load_config

BASE = {
    "name": "sizes", "seed": 0, "rounds": 1, "clients_per_round": 2,
    "data": {"name": "digits", "num_clients": 4, "partition": "iid", "batch_size": 32},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg"},
}
# The logistic model on digits: 64 x 10 kernel + 10 bias float32 parameters.
MODEL_BITS = (64 * 10 + 10) * 32


def _config(**overrides):
  return load_config({**BASE, **overrides})[0]


@pytest.mark.slow
def test_encoders_share_one_uncompressed_size_and_other_models_do_not(monkeypatch):
  compiled = []
  real = simulation._wire_bits

  def counting(algorithm, measured=False):
    compiled.append(algorithm)
    return real(algorithm, measured)

  monkeypatch.setattr(simulation, "_wire_bits", counting)
  monkeypatch.setattr(simulation, "_UNCOMPRESSED_WIRE", {})
  sims = [simulation.build_simulation(_config(
      compression={"aggregation": {"encoder": "uniform", "bits": bits, "min_elements": 1}}))
          for bits in (8, 4)]
  # Each run sizes its own compressed process; the uncompressed one is sized once.
  assert len(compiled) == 3
  assert sims[0].uncompressed_wire == sims[1].uncompressed_wire
  assert sims[0].uncompressed_wire.aggregate_model == MODEL_BITS
  assert sims[0].wire.aggregate_model < MODEL_BITS
  wider = simulation.build_simulation(_config(
      model={"name": "mlp", "hidden": [8]},
      compression={"aggregation": {"encoder": "uniform", "bits": 8, "min_elements": 1}}))
  assert len(compiled) == 5
  assert wider.uncompressed_wire.aggregate_model == (64 * 8 + 8 + 8 * 10 + 10) * 32
