"""EDEN (Vargaftik et al. 2022) against a NumPy reference of the paper's
quantizer: rotate, round sqrt(d) y / ||y|| to the nearest Lloyd-Max centroid
of N(0, 1), scale by ||y||^2 / <y, Q>, rotate back. Eager TensorFlow only."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_model_optimization.python.core.internal.tensor_encoding.utils import tf_utils

from fedsim.compression.stages.eden import EdenStage, normal_centroids
from tests.compression.test_paper_encoders import DRAWS, _hadamard, _round_trip

# Max (1960), "Quantizing for minimum distortion", Table I: the positive
# optimum output levels for a unit-variance Gaussian (negative ones mirror them).
MAX_1960 = {1: [0.7979], 2: [0.4528, 1.510], 3: [0.2451, 0.7560, 1.344, 2.152],
            4: [0.1284, 0.3881, 0.6568, 0.9424, 1.256, 1.618, 2.069, 2.733]}


@pytest.mark.parametrize("bits", sorted(MAX_1960))
def test_centroids_are_max_1960_levels(bits):
  positive = MAX_1960[bits]
  want = [-c for c in reversed(positive)] + positive
  np.testing.assert_allclose(normal_centroids(bits), want, atol=1e-3)


def _reference(values, seed, bits):
  """decode(encode(values)) by the paper, with fedsim's rotation signs of `seed`."""
  n = values.size
  m = 1 << (n - 1).bit_length()
  signs = tf_utils.random_signs(m, tf.constant(seed), tf.float64).numpy()[:n]
  x = np.zeros(m)
  x[:n] = values * signs
  h = _hadamard(m)
  y = h @ x
  c = np.asarray(normal_centroids(bits))
  z = math.sqrt(m) / np.linalg.norm(y) * y
  q = c[np.argmin(np.abs(z[:, None] - c[None, :]), axis=1)]
  s = (y @ y) / (y @ q)
  return (h.T @ (s * q))[:n] * signs, s, m


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_eden_matches_numpy_rotation_levels_and_scale(bits):
  values = np.random.default_rng(4).normal(size=[1000]).astype(np.float32)
  decoded, encoded = _round_trip(values, {"encoder": "eden", "bits": bits})
  reference, scale, m = _reference(values, encoded["seed"], bits)
  np.testing.assert_allclose(decoded, reference, rtol=0, atol=1e-6)
  assert encoded["scale"] == pytest.approx(scale, rel=1e-6)
  assert encoded["bitpacked_values"].shape == (math.ceil(m * bits / 28), 1)


def test_one_bit_eden_is_drive_with_its_unbiased_scale():
  values = np.random.default_rng(6).normal(size=[700]).astype(np.float32)
  eden, _ = _round_trip(values, {"encoder": "eden"})
  drive, _ = _round_trip(values, {"encoder": "drive", "scale": "unbiased"})
  np.testing.assert_allclose(eden, drive, rtol=0, atol=1e-6)


def _rotated_draws(x: np.ndarray, bits: int) -> np.ndarray:
  """[DRAWS, d]: R^T decode(encode(R x)) for DRAWS uniformly random rotations R
  (Haar: QR of a Gaussian matrix, signs fixed by R's diagonal)."""
  rng = np.random.default_rng(bits)
  d = x.size
  rotations = []
  for _ in range(DRAWS):
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    rotations.append(q * np.sign(np.diag(r)))
  rotations = np.stack(rotations)
  rotated = np.einsum("kij,j->ki", rotations, x).astype(np.float32)
  stage = EdenStage(bits)

  # The loop over draws in one graph: an eager map_fn calls a function per draw.
  @tf.function
  def all_draws(ys):
    return tf.map_fn(lambda y: stage.decode(stage.encode(y, {}), {}), ys)

  decoded = all_draws(tf.constant(rotated)).numpy().astype(np.float64)
  return np.einsum("kji,kj->ki", rotations, decoded)


@pytest.mark.parametrize("bits", [1, 2])
def test_eden_is_unbiased_under_uniform_random_rotations(bits):
  x = np.random.default_rng(7).normal(size=[32])
  draws = _rotated_draws(x, bits)
  standard_error = draws.std(axis=0, ddof=1) / math.sqrt(DRAWS)
  assert np.all(np.abs(draws.mean(axis=0) - x) <= 3 * standard_error)
  # The paper's normalized error for large d: D / (1 - D), D the Lloyd-Max
  # distortion of N(0, 1) (1 - 2 / pi at one bit, 0.1175 at two).
  c = np.asarray(normal_centroids(bits))
  grid = np.linspace(-9, 9, 200_001)
  density = np.exp(-grid**2 / 2) / math.sqrt(2 * math.pi)
  distortion = np.sum((grid - c[np.argmin(np.abs(grid[:, None] - c), axis=1)])**2 * density) * (
      grid[1] - grid[0])
  nmse = np.mean(np.sum((draws - x)**2, axis=1)) / (x @ x)
  assert nmse == pytest.approx(distortion / (1 - distortion), rel=0.15)


# The formula is the same at every width; `-m long` sizes 2 bits too.
@pytest.mark.parametrize("bits", [1, pytest.param(2, marks=pytest.mark.long)])
def test_fedavg_sizes_eden_to_its_packed_indices_scale_and_seed(bits):
  from fedsim.sizing.mapreduce_form import client_wire_bits
  from tests.learning import builders
  model = builders.task_model("mlp", (64,), 10, hidden=[200])   # kernels 12800 and 2000
  stage = {"name": "encode", "encoder": "eden", "bits": bits, "min_elements": 2000}
  algorithm = builders.algorithm("fedavg", {}, model, batch_size=4, aggregation=[stage],
                                 broadcast=[stage])
  wire = client_wire_bits(algorithm.process, algorithm.upload_extras_types)
  # Each kernel: its 16384 / 2048 padded indices of `bits` bits, packed 28 to an
  # int32, + one float32 scale + the int32[2] rotation seed; biases as float32.
  packed = sum(math.ceil(m * bits / 28) * 32 + 32 + 64 for m in (16384, 2048))
  assert wire.aggregate_model == wire.broadcast_model == packed + (200 + 10) * 32


@pytest.mark.parametrize("bits, message", [(0, "must be >= 1, got 0"), (9, "must be <= 8, got 9")])
def test_bad_bits_are_one_line(bits, message):
  from fedsim.compression import parse_direction
  from fedsim.errors import UserError
  with pytest.raises(UserError, match=rf"^aggregation\[0\]\.bits: {message}"):
    parse_direction({"encoder": "eden", "bits": bits}, "aggregation[0]")
