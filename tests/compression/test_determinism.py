"""Compressed FedAvg runs repeat bit for bit: the encoders' randomness is seeded by
the values they encode, salted by the run seed (see
`fedsim.compression.noise_seeds.noise_seed`)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from fedsim.compression import parse_compression
from tests.learning import builders

DIM, CLASSES = 20, 4   # an 80-element kernel (encoded) and a 4-element bias (sent as is)


def _clients(seed: int, count: int = 3, steps: int = 2, batch: int = 4) -> list[dict]:
  rng = np.random.default_rng(seed)
  return [{"x": rng.normal(size=(steps, batch, DIM)).astype(np.float32),
           "y": rng.integers(0, CLASSES, (steps, batch)).astype(np.int32),
           "mask": np.ones((steps, batch), np.float32)} for _ in range(count)]


def _two_rounds(encoder: str | None) -> tuple[list[np.ndarray], list]:
  compression = None if encoder is None else parse_compression({
      direction: {"encoder": encoder, "bits": 8, "rounding": "stochastic", "min_elements": 50}
      for direction in ("broadcast", "aggregation")})
  alg = builders.algorithm(
      "fedavg", {"client_optimizer": {"name": "sgd", "learning_rate": 0.5}},
      builders.task_model(input_shape=(DIM,), num_classes=CLASSES), batch_size=4,
      compression=compression)
  state, metrics = alg.process.initialize(), []
  for seed in (1, 2):
    state, round_metrics = alg.process.next(state, _clients(seed))
    metrics.append(round_metrics)
  weights = [np.asarray(w) for w in alg.model_weights(state).trainable]
  return weights, [np.asarray(m) for m in tf.nest.flatten(metrics)]


@pytest.fixture(scope="module")
def uncompressed(tff_runtime):
  return _two_rounds(None)


# Hadamard rounds stochastically after a seeded rotation, so it repeats both
# draws; `-m long` repeats uniform's stochastic rounding alone too.
@pytest.mark.slow
@pytest.mark.parametrize("encoder", [pytest.param("uniform", marks=pytest.mark.long), "hadamard"])
def test_stochastic_compression_repeats_bit_for_bit(tff_runtime, uncompressed, encoder):
  first, second = _two_rounds(encoder), _two_rounds(encoder)
  for a, b in zip(first[0] + first[1], second[0] + second[1]):
    assert a.tobytes() == b.tobytes()
  # The kernel was really quantized; the bias (below min_elements) was not
  # encoded but depends on the quantized kernel through training.
  kernel, plain_kernel = first[0][0], uncompressed[0][0]
  assert 0 < np.abs(kernel - plain_kernel).max() < 0.1 * np.abs(plain_kernel).max()


def _two_rounds_seeded(seed: int) -> list[np.ndarray]:
  """Weights after two rounds with qsgd up and drive down, noise salted by `seed`."""
  stage = {"name": "encode", "min_elements": 50}
  alg = builders.algorithm(
      "fedavg", {"client_optimizer": {"name": "sgd", "learning_rate": 0.5}},
      builders.task_model(input_shape=(DIM,), num_classes=CLASSES), batch_size=4,
      aggregation=[{**stage, "encoder": "qsgd", "levels": 3}],
      broadcast=[{**stage, "encoder": "drive"}], seed=seed)
  state = alg.process.initialize()
  for data_seed in (1, 2):
    state, _ = alg.process.next(state, _clients(data_seed))
  return [np.asarray(w) for w in alg.model_weights(state).trainable]


@pytest.mark.slow
def test_run_seed_changes_the_noise_and_repeats_it(tff_runtime):
  first, again, other = _two_rounds_seeded(0), _two_rounds_seeded(0), _two_rounds_seeded(1)
  assert all(a.tobytes() == b.tobytes() for a, b in zip(first, again))
  # Same clients and data: only the rounding and rotation noise differs.
  assert not np.array_equal(first[0], other[0])
