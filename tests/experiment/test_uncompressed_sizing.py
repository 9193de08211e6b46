"""A configuration's algorithm is built once per process: the runs of one config
share it, and the uncompressed reference size is compiled once for all encoders
and seeds of a sweep."""

from __future__ import annotations

import collections

import numpy as np
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
  monkeypatch.setattr(simulation, "_BUILT", collections.OrderedDict())
  monkeypatch.setattr(simulation, "_UNCOMPRESSED", collections.OrderedDict())
  sims = [simulation.build_simulation(_config(
      compression={"aggregation": {"encoder": "uniform", "bits": bits, "min_elements": 1}}))
          for bits in (8, 4)]
  # Each run sizes its own compressed process; the uncompressed one is built when
  # first asked for, and once.
  assert _distinct(compiled) == 2
  assert sims[0].uncompressed_wire == sims[1].uncompressed_wire
  assert _distinct(compiled) == 3
  assert sims[0].uncompressed_wire.aggregate_model == MODEL_BITS
  assert sims[0].wire.aggregate_model < MODEL_BITS
  # Another seed: other initial weights and draws, the same types: only its
  # compressed process is built and sized.
  reseeded = simulation.build_simulation(_config(
      seed=1, compression={"aggregation": {"encoder": "uniform", "bits": 8, "min_elements": 1}}))
  assert reseeded.algorithm is not sims[0].algorithm
  assert reseeded.uncompressed_wire == sims[0].uncompressed_wire
  assert _distinct(compiled) == 4
  assert reseeded.uncompressed_wire.aggregate_model == MODEL_BITS
  wider = simulation.build_simulation(_config(
      model={"name": "mlp", "hidden": [8]},
      compression={"aggregation": {"encoder": "uniform", "bits": 8, "min_elements": 1}}))
  assert wider.uncompressed_wire.aggregate_model == (64 * 8 + 8 + 8 * 10 + 10) * 32
  assert _distinct(compiled) == 6


def _distinct(objects) -> int:
  return len({id(o) for o in objects})


@pytest.mark.slow
def test_a_config_built_again_reuses_its_algorithm_and_only_its_own(monkeypatch, tmp_path):
  monkeypatch.setattr(simulation, "_BUILT", collections.OrderedDict())
  monkeypatch.setattr(simulation, "_UNCOMPRESSED", collections.OrderedDict())
  first = simulation.build_simulation(_config())
  again = simulation.build_simulation(_config(rounds=5, name="other"))
  assert again.algorithm is first.algorithm and again.round_process is first.round_process
  for changed in (_config(seed=1), _config(clients_per_round=3),
                  _config(algorithm={"name": "fedavg", "client_optimizer": {
                      "name": "sgd", "learning_rate": 0.5}})):
    assert simulation.build_simulation(changed).algorithm is not first.algorithm
  # Initial weights from a file: its values are part of the key, not its name.
  weights = tmp_path / "init.npz"
  names = first.model.weight_names
  shapes = [w.shape for w in first.model.initial_weights.trainable]
  np.savez(weights, **{n: np.zeros(s, np.float32) for n, s in zip(names, shapes)})
  model = {"name": "logistic", "initial_weights": str(weights)}
  from_file = simulation.build_simulation(_config(model=model))
  np.savez(weights, **{n: np.ones(s, np.float32) for n, s in zip(names, shapes)})
  rewritten = simulation.build_simulation(_config(model=model))
  assert rewritten.algorithm is not from_file.algorithm
  assert simulation.build_simulation(_config(model=model)).algorithm is rewritten.algorithm
  assert len(simulation._BUILT) <= simulation._BUILT_KEEP


@pytest.mark.slow
def test_a_run_builds_its_uncompressed_reference_only_when_it_is_read(monkeypatch, tmp_path):
  """Only `fedsim run`'s summary compares with the uncompressed run: an API run
  of a compressed config does not build it before round 1, nor at all unless
  its result's `uncompressed_bits_per_client` is read."""
  import fedsim
  built = []
  real = simulation._build_algorithm

  def counting(config, model, compressed=True, **kwargs):
    built.append(compressed)
    return real(config, model, compressed, **kwargs)

  monkeypatch.setattr(simulation, "_build_algorithm", counting)
  monkeypatch.setattr(simulation, "_BUILT", collections.OrderedDict())
  monkeypatch.setattr(simulation, "_UNCOMPRESSED", collections.OrderedDict())
  result = fedsim.run({**BASE, "compression": {"aggregation": {
      "encoder": "uniform", "bits": 8, "min_elements": 1}}}, logdir=tmp_path, progress=False)
  assert built == [True]
  # The logistic model's weights go down as float32; up, its delta and the
  # client's weight and metrics (more than the model).
  broadcast, aggregate = result.uncompressed_bits_per_client
  assert built == [True, False]
  assert broadcast == MODEL_BITS and aggregate > MODEL_BITS
  assert result.uncompressed_bits_per_client == (broadcast, aggregate)
  assert built == [True, False]   # read once, kept
