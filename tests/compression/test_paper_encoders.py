"""The encoders papers compare, against NumPy references of their encode/decode.

Deterministic encoders are compared to 1e-6; stochastic ones are checked for
unbiasedness (within 3 standard errors per coordinate over 2,000 seeded draws)
and against the paper's variance bound. Eager TensorFlow only, no TFF worker.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_model_optimization.python.core.internal.tensor_encoding.utils import tf_utils

from fedsim.compression import parse_direction
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.encoders import encoder_for
from fedsim.compression.stages.stochastic_levels import L2, MAX, StochasticLevelsStage
from fedsim.compression.stages.sparsify import RandKStage
from tests.compression.test_encoders import _reimported_shapes

DRAWS = 2000


def _round_trip(values, config, run_seed=0, index=0):
  """decoded, {encoded key: array} of `values` through the registered encoder `config`."""
  spec = tf.TensorSpec(values.shape, tf.float32)
  direction = parse_direction({**config, "min_elements": 1}, "aggregation")
  with te_api.noise_key(run_seed, index):
    encoder = te_api.simple_encoder(encoder_for(spec, direction), spec)
  encoded, _ = encoder.encode(tf.constant(values))
  return encoder.decode(encoded).numpy(), {k.split("/")[-1]: v.numpy() for k, v in encoded.items()}


def _draws(make_stage, x: np.ndarray, shape=None) -> np.ndarray:
  """[DRAWS, n]: decode(encode(x)) of stages built with DRAWS different salts."""
  salts = tf.constant(np.random.default_rng(0).integers(-2**31, 2**31, (DRAWS, 2)), tf.int32)

  def one(salt):
    stage = make_stage(salt)
    encoded = stage.encode(tf.constant(x), stage.get_params()[0])
    return stage.decode(encoded, {}, shape=shape)

  # The loop over draws in one graph: an eager map_fn calls a function per draw.
  @tf.function
  def all_draws(salts):
    return tf.map_fn(one, salts, fn_output_signature=tf.float32)

  return all_draws(salts).numpy().astype(np.float64)


def _assert_unbiased(draws: np.ndarray, x: np.ndarray, variance: np.ndarray):
  """Each coordinate's mean within 3 standard errors of x; the standard error
  from the paper's variance (a rare event may not occur in the draws at all,
  leaving an empirical one of 0)."""
  standard_error = np.sqrt(variance / len(draws))
  assert np.all(np.abs(draws.mean(axis=0) - x) <= 3 * standard_error + 1e-7)


X = np.random.default_rng(7).normal(size=[32]).astype(np.float32)


# QSGD (Alistarh et al. 2017): Q(x)_i = ||x|| sign(x_i) l_i / s with l_i the
# floor or ceiling of |x_i| / ||x|| * s.
@pytest.mark.parametrize("levels", [1, 7])
def test_qsgd_decodes_to_a_neighbouring_level_of_the_l2_norm(levels):
  values = np.random.default_rng(1).normal(size=[50, 40]).astype(np.float32)
  decoded, encoded = _round_trip(values, {"encoder": "qsgd", "levels": levels})
  norm = np.linalg.norm(values.astype(np.float64))
  scaled = np.abs(values) / norm * levels
  floor = np.sign(values) * np.floor(scaled) * norm / levels
  ceil = np.sign(values) * np.ceil(scaled) * norm / levels
  off = np.minimum(np.abs(decoded - floor), np.abs(decoded - ceil))
  assert off.max() <= 1e-6 * norm
  bits = math.ceil(math.log2(2 * levels + 1))
  assert encoded["bitpacked_values"].shape == (math.ceil(2000 * bits / 28), 1)
  assert encoded["scale"] == pytest.approx(norm, rel=1e-6)


@pytest.mark.parametrize("levels", [1, 4])
def test_qsgd_is_unbiased_within_its_variance_bound(levels):
  draws = _draws(lambda salt: StochasticLevelsStage(levels, L2, salt=salt), X)
  n, norm2 = X.size, float(np.sum(X.astype(np.float64)**2))
  # The exact variance: (||x|| / s)^2 p (1 - p) per coordinate, p the remainder.
  scaled = np.abs(X) / math.sqrt(norm2) * levels
  p = scaled - np.floor(scaled)
  variance = norm2 / levels**2 * p * (1 - p)
  _assert_unbiased(draws, X, variance)
  mse = np.mean(np.sum((draws - X)**2, axis=1))
  assert mse <= min(n / levels**2, math.sqrt(n) / levels) * norm2
  assert mse == pytest.approx(variance.sum(), rel=0.1)


@pytest.mark.parametrize("bucket", [8, 12])
def test_qsgd_buckets_have_their_own_norm(bucket):
  levels = 3
  values = np.random.default_rng(12).normal(size=[30]).astype(np.float32)
  decoded, encoded = _round_trip(values, {"encoder": "qsgd", "levels": levels, "bucket": bucket})
  count = -(-30 // bucket)
  padded = np.zeros(count * bucket)
  padded[:30] = values
  norms = np.linalg.norm(padded.reshape(count, bucket), axis=1)
  np.testing.assert_allclose(encoded["scale"], norms, rtol=1e-6)
  norm = np.repeat(norms, bucket)[:30]
  scaled = np.abs(values) / norm * levels
  floor = np.sign(values) * np.floor(scaled) * norm / levels
  ceil = np.sign(values) * np.ceil(scaled) * norm / levels
  assert np.minimum(np.abs(decoded - floor), np.abs(decoded - ceil)).max() <= 1e-6 * norm.max()
  assert encoded["bitpacked_values"].shape == (math.ceil(count * bucket * 3 / 28), 1)


def test_bucketed_qsgd_is_unbiased_within_the_per_bucket_bound():
  levels, bucket = 2, 8
  draws = _draws(lambda salt: StochasticLevelsStage(levels, L2, bucket, salt=salt), X,
                 shape=tf.constant([X.size]))
  x = X.astype(np.float64).reshape(-1, bucket)
  norms = np.linalg.norm(x, axis=1, keepdims=True)
  p = np.abs(x) / norms * levels - np.floor(np.abs(x) / norms * levels)
  variance = (norms**2 / levels**2 * p * (1 - p)).reshape(-1)
  _assert_unbiased(draws, X, variance)
  mse = np.mean(np.sum((draws - X)**2, axis=1))
  assert mse <= min(bucket / levels**2, math.sqrt(bucket) / levels) * np.sum(x**2)
  assert mse == pytest.approx(variance.sum(), rel=0.1)


# TernGrad (Wen et al. 2017): s_t sign(x_i) b_i, b_i ~ Bernoulli(|x_i| / s_t), s_t = max |x|.
def test_terngrad_sends_ternary_values_of_the_max():
  values = np.random.default_rng(2).normal(size=[3000]).astype(np.float32)
  decoded, encoded = _round_trip(values, {"encoder": "terngrad"})
  scale = np.abs(values).max()
  assert encoded["scale"] == scale
  zero, full = np.abs(decoded) <= 1e-6 * scale, np.abs(np.abs(decoded) - scale) <= 1e-6 * scale
  assert np.all(zero | full)
  assert np.all(np.sign(decoded[full]) == np.sign(values[full]))
  assert encoded["bitpacked_values"].shape == (math.ceil(3000 * 2 / 28), 1)


def test_terngrad_is_unbiased_with_its_variance():
  draws = _draws(lambda salt: StochasticLevelsStage(1, MAX, salt=salt), X)
  x, scale = X.astype(np.float64), float(np.abs(X).max())
  variance = scale * np.abs(x) - x**2   # per coordinate, from the paper
  _assert_unbiased(draws, X, variance)
  mse = np.mean(np.sum((draws - x)**2, axis=1))
  assert mse == pytest.approx(variance.sum(), rel=0.1)


# Scaled sign (signSGD with the scale ||x||_1 / n): deterministic.
def test_sign_sends_one_bit_and_the_mean_magnitude():
  values = np.random.default_rng(3).normal(size=[40, 50]).astype(np.float32)
  values[0, :3] = 0.0   # zero counts as positive
  decoded, encoded = _round_trip(values, {"encoder": "sign"})
  reference = np.where(values >= 0, 1.0, -1.0) * np.abs(values.astype(np.float64)).mean()
  np.testing.assert_allclose(decoded, reference, rtol=0, atol=1e-6)
  assert encoded["bitpacked_values"].shape == (math.ceil(2000 / 28), 1)


def _hadamard(m: int) -> np.ndarray:
  """The orthonormal m x m Walsh-Hadamard matrix (Sylvester's construction)."""
  h = np.ones((1, 1))
  while len(h) < m:
    h = np.block([[h, h], [h, -h]])
  return h / math.sqrt(m)


# DRIVE (Vargaftik et al. 2021): y = H D x (padded), send sign(y) and S; decode
# D H^T (S sign(y)). S = ||x||^2 / ||y||_1 (unbiased) or ||y||_1 / m (mse).
@pytest.mark.parametrize("scale", ["unbiased", "mse"])
def test_drive_matches_numpy_rotation_sign_and_scale(scale):
  n, m = 1000, 1024
  values = np.random.default_rng(4).normal(size=[n]).astype(np.float32)
  decoded, encoded = _round_trip(values, {"encoder": "drive", "scale": scale})
  signs = tf_utils.random_signs(m, tf.constant(encoded["seed"]), tf.float64).numpy()[:n]
  h = _hadamard(m)
  x = np.zeros(m)
  x[:n] = values * signs
  y = h @ x
  s = np.sum(x**2) / np.abs(y).sum() if scale == "unbiased" else np.abs(y).mean()
  reference = (h.T @ (s * np.where(y >= 0, 1.0, -1.0)))[:n] * signs
  np.testing.assert_allclose(decoded, reference, rtol=0, atol=1e-6)
  assert encoded["scale"] == pytest.approx(s, rel=1e-6)
  assert encoded["bitpacked_values"].shape == (math.ceil(m / 28), 1)


def test_drive_unbiased_scale_preserves_the_projection_on_x():
  # <x, decoded> = S ||y||_1 = ||x||^2: DRIVE's unbiased scale, exactly.
  values = np.random.default_rng(5).normal(size=[512]).astype(np.float32)
  decoded, _ = _round_trip(values, {"encoder": "drive"})
  x = values.astype(np.float64)
  assert x @ decoded == pytest.approx(x @ x, rel=1e-5)


# Top-k: keep the k = ceil(f n) largest |x_i|; values and int32 indices.
@pytest.mark.parametrize("config, k", [({"fraction": 0.01}, 20), ({"fraction": 0.5}, 1000),
                                       ({"k": 7}, 7), ({"fraction": 1e-6}, 1)])
def test_topk_keeps_the_k_largest_magnitudes(config, k):
  values = np.random.default_rng(6).normal(size=[40, 50]).astype(np.float32)
  decoded, encoded = _round_trip(values, {"encoder": "topk", **config})
  flat = values.reshape(-1)
  reference = np.zeros_like(flat)
  kept = np.argsort(-np.abs(flat))[:k]
  reference[kept] = flat[kept]
  np.testing.assert_allclose(decoded.reshape(-1), reference, rtol=0, atol=1e-6)
  assert encoded["values"].shape == (k,) and encoded["indices"].shape == (k,)
  assert encoded["indices"].dtype == np.int32


# Random-k: k coordinates uniformly without replacement, times n / k if unbiased.
def test_randk_keeps_k_coordinates_scaled_by_n_over_k():
  values = np.random.default_rng(8).normal(size=[2000]).astype(np.float32)
  decoded, encoded = _round_trip(values, {"encoder": "randk", "fraction": 0.05})
  kept = np.flatnonzero(decoded)
  assert kept.size == 100 and encoded["values"].shape == (100,)
  assert set(encoded) == {"values", "seed"}
  np.testing.assert_allclose(decoded[kept], values[kept] * 20, rtol=1e-6)
  biased, _ = _round_trip(values, {"encoder": "randk", "fraction": 0.05, "unbiased": False})
  np.testing.assert_allclose(biased[np.flatnonzero(biased)], values[np.flatnonzero(biased)],
                             rtol=0, atol=1e-6)


def test_randk_is_unbiased_with_its_variance():
  k = 8
  draws = _draws(lambda salt: RandKStage(k=k, salt=salt), X, shape=tf.constant([X.size]))
  assert np.all(np.count_nonzero(draws, axis=1) == k)
  x = X.astype(np.float64)
  variance = x**2 * (X.size / k - 1)
  _assert_unbiased(draws, X, variance)
  assert np.mean(np.sum((draws - x)**2, axis=1)) == pytest.approx(variance.sum(), rel=0.1)


# Kashin: x = D (H b)[:n] for the coefficients b, whatever the clipping did.
def test_kashin_coefficients_reconstruct_x_in_numpy():
  n = 900
  values = np.random.default_rng(9).standard_t(2, size=[n]).astype(np.float32)
  stage = te_api.SeededKashinStage(salt=np.zeros(2, np.int32))
  encoded = stage.encode(tf.constant(values), stage.get_params()[0])
  b = encoded[stage.ENCODED_VALUES_KEY].numpy()[0].astype(np.float64)
  m = b.size
  assert m == 2048   # 900 > 0.85 * 1024: one more level of padding
  signs = tf_utils.random_signs(n, encoded["seed"], tf.float64).numpy()
  np.testing.assert_allclose((_hadamard(m) @ b)[:n] * signs, values, rtol=0,
                             atol=1e-5 * np.abs(values).max())
  # The point of it: coefficients far flatter than the heavy-tailed input.
  assert np.abs(b).max() / np.linalg.norm(b) < 0.5 * np.abs(values).max() / np.linalg.norm(values)


def test_kashin_chain_quantizes_the_coefficients():
  values = np.random.default_rng(10).normal(size=[800]).astype(np.float32)
  decoded, encoded = _round_trip(values, {"encoder": "kashin", "bits": 4})
  assert encoded["bitpacked_values"].shape == (math.ceil(1024 * 4 / 28), 1)   # 800 coefficients padded to 1024
  assert np.linalg.norm(decoded - values) < 0.3 * np.linalg.norm(values)


# Randomness: (run seed, tensor index, values) -> noise.
@pytest.mark.parametrize("config", [{"encoder": "qsgd"}, {"encoder": "uniform", "bits": 2},
                                    {"encoder": "randk"}, {"encoder": "drive"}])
def test_noise_repeats_for_a_seed_and_changes_with_seed_and_tensor(config):
  values = np.random.default_rng(11).normal(size=[3000]).astype(np.float32)
  first, _ = _round_trip(values, config, run_seed=1)
  again, _ = _round_trip(values, config, run_seed=1)
  other_seed, _ = _round_trip(values, config, run_seed=2)
  other_tensor, _ = _round_trip(values, config, run_seed=1, index=1)
  assert first.tobytes() == again.tobytes()
  assert not np.array_equal(first, other_seed)
  assert not np.array_equal(first, other_tensor)


def test_noise_salt_is_seed_sequence_of_seed_and_index():
  expected = np.random.SeedSequence([5, 3]).generate_state(2, np.uint32).view(np.int32)
  np.testing.assert_array_equal(te_api.noise_salt(5, 3), expected)
  with te_api.noise_key(5, 3):
    np.testing.assert_array_equal(te_api.noise_salt(), expected)
  assert te_api.noise_salt(-1, 0).tolist() == te_api.noise_salt(2**64 - 1, 0).tolist()


ENCODERS = [{"encoder": "qsgd"}, {"encoder": "qsgd", "bucket": 512}, {"encoder": "terngrad"}, {"encoder": "sign"},
            {"encoder": "drive"}, {"encoder": "topk", "fraction": 0.1}, {"encoder": "randk"},
            {"encoder": "kashin"}]


@pytest.mark.parametrize("config", ENCODERS, ids=lambda c: c["encoder"])
def test_encoded_shapes_stay_static_in_a_reimported_graph(config):
  direction = parse_direction({**config, "min_elements": 1}, "c.a")
  for size, shapes in zip([100, 2049, 10003], _reimported_shapes(direction, [100, 2049, 10003])):
    assert all(None not in shape for shape in shapes.values()), (size, shapes)
    assert shapes["decoded"] == (size,)
