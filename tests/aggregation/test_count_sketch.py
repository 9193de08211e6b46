"""count_sketch (FetchSGD, Rothchild et al. 2020) against a NumPy transcription of
the paper's Algorithm 1 on toy clients, under a plain and a secure sum, and its
size in the compiled round. The reference takes fedsim's hash and sign
functions (stateless TensorFlow draws) and does everything else itself."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from fedsim.aggregation import UNWEIGHTED_MEAN, WEIGHTED_MEAN, parse_aggregation
from fedsim.errors import UserError

ROWS, COLUMNS, K, RHO, SEED = 5, 64, 40, 0.9, 3
SHAPES = [(30, 20), (20,)]
D = 620


def _hashes(index: int = 0) -> tuple[np.ndarray, np.ndarray]:
  from fedsim.aggregation.sketching import hash_seed, hashes
  buckets, signs = hashes(D, ROWS, COLUMNS, hash_seed(SEED, index))
  return buckets.numpy(), signs.numpy().astype(np.float64)


def _sketch(vector, buckets, signs) -> np.ndarray:
  table = np.zeros([ROWS, COLUMNS])
  for j in range(ROWS):
    np.add.at(table[j], buckets[j], signs[j] * vector)
  return table


class _FetchSGD:
  """Algorithm 1's server, with the paper's zeroing of S_e where S(delta) != 0."""

  def __init__(self, buckets, signs):
    self.buckets, self.signs = buckets, signs
    self.velocity, self.error = np.zeros([ROWS, COLUMNS]), np.zeros([ROWS, COLUMNS])

  def round(self, updates, weights) -> np.ndarray:
    sketches = [_sketch(u, self.buckets, self.signs) for u in updates]
    mean = np.tensordot(weights, sketches, axes=1) / np.sum(weights)
    self.velocity = RHO * self.velocity + mean
    self.error = self.error + self.velocity
    estimate = np.median(self.signs * self.error[np.arange(ROWS)[:, None], self.buckets], axis=0)
    delta = np.zeros(D)
    kept = np.argsort(-np.abs(estimate), kind="stable")[:K]   # ties: lowest index first
    delta[kept] = estimate[kept]
    self.error[_sketch(delta, self.buckets, self.signs) != 0] = 0
    return delta


def _clients(round_index: int, count: int = 3) -> list[list[np.ndarray]]:
  rng = np.random.default_rng(round_index)
  clients = []
  for _ in range(count):
    kernel = rng.normal(size=SHAPES[0]).astype(np.float32) * 0.1
    kernel[rng.integers(0, 30, 4), rng.integers(0, 20, 4)] += 3.0   # a few heavy coordinates
    clients.append([kernel, rng.normal(size=SHAPES[1]).astype(np.float32) * 0.1])
  return clients


def _flat(client) -> np.ndarray:
  return np.concatenate([x.reshape(-1) for x in client]).astype(np.float64)


def _process(chain, kind):
  import tensorflow_federated as tff
  from fedsim.aggregation.chain import build_chain
  factory, _ = build_chain(parse_aggregation(chain), kind, 3, SEED)
  value_type = tff.to_type([(np.float32, s) for s in SHAPES])
  if kind == WEIGHTED_MEAN:
    return factory.create(value_type, tff.TensorType(np.float32))
  return factory.create(value_type)


SKETCH = {"name": "count_sketch", "rows": ROWS, "columns": COLUMNS, "k": K, "momentum": RHO}


@pytest.mark.parametrize("kind", [WEIGHTED_MEAN, UNWEIGHTED_MEAN])
def test_three_rounds_equal_the_papers_algorithm(tff_runtime, kind):
  process = _process([SKETCH], kind)
  reference = _FetchSGD(*_hashes())
  state = process.initialize()
  for r in range(3):
    clients = _clients(r)
    weights = [1.0, 2.0, 5.0] if kind == WEIGHTED_MEAN else [1.0, 1.0, 1.0]
    args = (clients, weights) if kind == WEIGHTED_MEAN else (clients,)
    output = process.next(state, *args)
    state = output.state
    want = reference.round([_flat(c) for c in clients], np.array(weights))
    got = _flat(output.result)
    assert np.count_nonzero(got) == K
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["error"], reference.error, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state["momentum"], reference.velocity, rtol=1e-5, atol=1e-6)
    assert output.measurements["error_norm"] == pytest.approx(
        np.linalg.norm(reference.error), rel=1e-5)


def test_secure_sum_gives_the_unsecured_rounds(tff_runtime):
  plain = _process([SKETCH], WEIGHTED_MEAN)
  secure = _process([SKETCH, {"name": "secure", "upper": 50.0}], WEIGHTED_MEAN)
  assert "federated_secure_sum_bitwidth" in secure.next.to_building_block().compact_representation()
  plain_state, secure_state = plain.initialize(), secure.initialize()
  for r in range(2):
    clients, weights = _clients(r), [1.0, 2.0, 5.0]
    a = plain.next(plain_state, clients, weights)
    b = secure.next(secure_state, clients, weights)
    plain_state, secure_state = a.state, b.state
    # The secure sum rounds each value to a 32-bit integer step of its range [-50, 50].
    np.testing.assert_allclose(_flat(b.result), _flat(a.result), rtol=1e-5, atol=1e-5)
    assert np.count_nonzero(_flat(b.result)) == K


def test_heavy_coordinates_are_recovered_from_a_wide_sketch():
  # Count sketch's promise: with c >> k, the k heavy coordinates of a vector
  # are found and estimated within the light ones' mass per bucket.
  import tensorflow as tf
  from fedsim.aggregation.sketching import hashes, sketch, top_k, unsketch
  d, rows, columns, k = 5000, 5, 2000, 10
  rng = np.random.default_rng(4)
  x = rng.normal(size=d).astype(np.float32) * 0.01
  heavy = rng.choice(d, k, replace=False)
  x[heavy] = rng.choice([-1.0, 1.0], k) * rng.uniform(1, 2, k)
  buckets, signs = hashes(d, rows, columns, np.array([1, 2], np.int32))
  delta = top_k(unsketch(sketch(tf.constant(x), buckets, signs, columns), buckets, signs),
                k).numpy()
  assert set(np.flatnonzero(delta)) == set(heavy)
  np.testing.assert_allclose(delta[heavy], x[heavy], atol=0.05)


def test_fedavg_uploads_rows_times_columns_floats():
  from fedsim.sizing.mapreduce_form import client_wire_bits
  from tests.learning import builders
  model = builders.task_model("mlp", (64,), 10, hidden=[200])   # 15,010 parameters
  stage = dict(SKETCH, rows=3, columns=1000)
  algorithm = builders.algorithm("fedavg", {}, model, batch_size=4, aggregation=[stage])
  wire = client_wire_bits(algorithm.process, algorithm.upload_extras_types)
  assert wire.aggregate_model == 3 * 1000 * 32
  assert wire.broadcast_model == 15_010 * 32


@pytest.mark.parametrize("key, value, message", [("rows", 0, "must be >= 1, got 0"),
                                                 ("momentum", 1.5, "must be <= 1, got 1.5")])
def test_bad_parameters_are_one_line(key, value, message):
  with pytest.raises(UserError, match=rf"^aggregation\[0\]\.{key}: {message}"):
    parse_aggregation([{"name": "count_sketch", key: value}])


@pytest.mark.parametrize("chain", [[{"name": "mean"}, SKETCH],
                                   [{"name": "clip", "norm": 1.0}, SKETCH]])
def test_count_sketch_must_come_first(chain):
  from fedsim.aggregation import check_chain
  with pytest.raises(UserError, match=r"^aggregation\[1\] count_sketch: must be the first stage"):
    check_chain(parse_aggregation(chain), WEIGHTED_MEAN, "fedavg", 3)


@pytest.mark.slow
def test_a_config_runs_count_sketch_over_a_secure_sum(tff_runtime, tmp_path):
  import fedsim
  config = {
      "name": "fetchsgd", "seed": 1, "rounds": 2, "clients_per_round": 3,
      "data": {"name": "digits", "num_clients": 8, "partition": "iid", "batch_size": 16},
      "model": {"name": "logistic"}, "algorithm": {"name": "fedavg"},
      "aggregation": [{"name": "count_sketch", "rows": 3, "columns": 200, "k": 100},
                      {"name": "secure", "upper": 100.0}],
  }
  rows = fedsim.run(config, logdir=tmp_path).metrics
  assert [r["aggregation/secure/secure_upper_clipped_count"] for r in rows] == [0, 0]
  assert all(r["aggregation/count_sketch/error_norm"] > 0 for r in rows)
  assert rows[1]["train/loss"] < rows[0]["train/loss"]


@pytest.mark.slow
def test_without_momentum_the_compiled_round_equals_tffs(tff_runtime, tmp_path):
  """momentum: 0 on inprocess (a product 0 * velocity once left the compiled
  round a placeholder it never fed) gives local's rounds."""
  import fedsim
  config = {
      "name": "fetchsgd0", "seed": 1, "rounds": 2, "clients_per_round": 3,
      "data": {"name": "digits", "num_clients": 8, "partition": "iid", "batch_size": 16},
      "model": {"name": "logistic"}, "algorithm": {"name": "fedavg"},
      "aggregation": [{"name": "count_sketch", "rows": 3, "columns": 200, "k": 50,
                       "momentum": 0.0}],
  }
  want = fedsim.run({**config, "runtime": {"name": "local"}}, logdir=tmp_path / "local")
  got = fedsim.run({**config, "runtime": {"name": "inprocess", "device": "cpu"}},
                   logdir=tmp_path / "inprocess")
  for g, w in zip(got.final_weights, want.final_weights, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  assert not np.allclose(got.final_weights[0], 0.0)
