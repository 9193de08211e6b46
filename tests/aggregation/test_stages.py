"""Aggregation stages against NumPy references of what their papers and TFF's
documentation say they compute, on three toy clients."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from fedsim.aggregation import parse_aggregation
from fedsim.aggregation.measurements import aggregation_metrics

N = 2000  # elements per client value: enough for the noise's statistics


def _clients():
  rng = np.random.default_rng(7)
  directions = rng.normal(size=(3, N)).astype(np.float32)
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  return directions * np.array([[0.5], [2.0], [4.0]], np.float32)  # L2 norms 0.5, 2, 4


def _process(stages, kind, clients_per_round=3, seed=5):
  import tensorflow_federated as tff
  from fedsim.aggregation.chain import build_chain
  factory, plan = build_chain(parse_aggregation(stages), kind, clients_per_round, seed)
  value_type = tff.TensorType(np.float32, [N])
  if kind == "weighted_mean":
    return factory.create(value_type, tff.TensorType(np.float32)), plan
  return factory.create(value_type), plan


def _clip(u, c):
  return u * min(1.0, c / float(np.linalg.norm(u)))


def _noise(seed, stage, round_num, draw, stddev):
  """The documented stream: stateless normal seeded by fold_in([seed*256 + stage, round], draw)."""
  import tensorflow as tf
  base = tf.constant([(seed << 8) + stage, round_num], tf.int64)
  seed_pair = tf.random.experimental.stateless_fold_in(base, draw)
  return tf.random.stateless_normal([N], seed_pair, stddev=stddev).numpy()


def test_dp_gaussian_is_clip_then_noise_then_mean(tff_runtime):
  values = _clients()
  process, plan = _process([{"name": "dp_gaussian", "noise_multiplier": 0.7, "clip": 1.0}],
                           "mean")
  state = process.initialize()
  clipped_sum = sum(_clip(u, 1.0) for u in values)
  for round_num in range(2):
    out = process.next(state, list(values))
    state = out.state
    expected = (clipped_sum + _noise(5, 0, round_num, 1, 0.7)) / 3
    np.testing.assert_allclose(out.result, expected, rtol=1e-5, atol=1e-6)
    metrics = aggregation_metrics(plan, out.measurements)
    assert metrics == {"aggregation/dp_gaussian/clip": 1.0,
                       "aggregation/dp_gaussian/noise_stddev": pytest.approx(0.7)}
  noise = out.result * 3 - clipped_sum
  assert abs(noise.mean()) < 4 * 0.7 / np.sqrt(N)
  assert noise.std() == pytest.approx(0.7, rel=0.1)


def test_fixed_clip_before_the_weighted_mean(tff_runtime):
  values, weights = _clients(), [1.0, 3.0, 6.0]
  process, plan = _process([{"name": "clip", "norm": 1.0}], "weighted_mean")
  out = process.next(process.initialize(), list(values), weights)
  expected = sum(w * _clip(u, 1.0) for w, u in zip(weights, values)) / sum(weights)
  np.testing.assert_allclose(out.result, expected, rtol=1e-5, atol=1e-7)
  assert aggregation_metrics(plan, out.measurements) == {
      "aggregation/clip/clipping_norm": 1.0, "aggregation/clip/clipped_count": 2.0}


def test_zeroing_replaces_large_updates_by_zeros_in_the_mean(tff_runtime):
  values = _clients()
  linf = np.abs(values).max(axis=1)
  max_norm = float((linf[0] + linf[1]) / 2)  # client 0 passes, 1 and 2 are zeroed
  process, plan = _process([{"name": "zeroing", "max_norm": max_norm}], "mean")
  out = process.next(process.initialize(), list(values))
  np.testing.assert_allclose(out.result, values[0] / 3, rtol=1e-6)
  assert aggregation_metrics(plan, out.measurements)["aggregation/zeroing/zeroed_count"] == 2


def test_adaptive_clip_follows_the_geometric_quantile_update(tff_runtime):
  # Andrew et al. 2021: C <- C exp(-lr (b - q)), b the fraction of norms <= C.
  process, plan = _process([{"name": "clip", "norm": 1.0, "adaptive": True,
                             "target_quantile": 0.5, "learning_rate": 0.2}], "mean")
  state, clip = process.initialize(), 1.0
  for _ in range(3):
    out = process.next(state, list(_clients()))
    state = out.state
    assert aggregation_metrics(plan, out.measurements)["aggregation/clip/clipping_norm"] \
        == pytest.approx(clip, rel=1e-6)
    below = np.mean(np.array([0.5, 2.0, 4.0]) <= clip)
    clip *= np.exp(-0.2 * (below - 0.5))


def test_measurements_are_named_by_stage():
  plan = (("zeroing", "zeroing", None), ("clip", "clipping", None), ("mean", "mean_value", None),
          ("dp_gaussian", "dp", "dp_query_metrics"))
  measurements = collections.OrderedDict(
      zeroing=collections.OrderedDict(
          clipping=collections.OrderedDict(
              mean_value=collections.OrderedDict(
                  dp_query_metrics=collections.OrderedDict(clip=np.float32(2.0)), dp=()),
              mean_weight=()),
          clipping_norm=np.float32(1.5), clipped_count=np.int32(2)),
      zeroing_norm=np.float32(9.0), zeroed_count=np.int32(0))
  assert aggregation_metrics(plan, measurements) == {
      "aggregation/zeroing/zeroing_norm": 9.0, "aggregation/zeroing/zeroed_count": 0.0,
      "aggregation/clip/clipping_norm": 1.5, "aggregation/clip/clipped_count": 2.0,
      "aggregation/dp_gaussian/clip": 2.0}
