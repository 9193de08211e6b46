"""FedSGD and elastic averaging as TFF processes, against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

from tests.learning import builders, reference
from tests.learning.test_fedavg import _clients, _run_stateful


def test_fedsgd_is_one_centralized_sgd_step_on_the_union(tff_runtime):
  model = builders.task_model()
  alg = builders.algorithm("fedsgd", {"server_optimizer": {"name": "sgd", "learning_rate": 0.5}},
                           model)
  data = _clients(4, [(2, 1), (3, 0), (1, 1)])
  state = alg.process.initialize()
  state, metrics = alg.process.next(state, data)
  w, b = [np.array(v) for v in model.initial_weights.trainable]
  # The union of all real examples as one batch.
  xs = np.concatenate([c["x"][i][c["mask"][i] > 0] for c in data for i in range(len(c["mask"]))])
  ys = np.concatenate([c["y"][i][c["mask"][i] > 0] for c in data for i in range(len(c["mask"]))])
  gw, gb = reference.batch_grad(w, b, xs, ys, np.ones(len(ys), np.float32))
  trained = alg.model_weights(state).trainable
  np.testing.assert_allclose(trained[0], w - 0.5 * gw, atol=1e-6)
  np.testing.assert_allclose(trained[1], b - 0.5 * gb, atol=1e-6)
  assert float(metrics["client_work"]["num_examples"]) == len(ys) == 3 + 6 + 1


def _easgd_reference(w, b, rounds, alpha, rho, lr, momentum=0.0, encode=None):
  """Center and local models after `rounds` of [(client index, batches)].

  Each client keeps its local model and its momentum accumulator
  (`tf.compat.v1.train.MomentumOptimizer`) between the rounds it takes part in;
  `encode(value) -> decoded` models what crosses the wire.
  """
  center = (w.copy(), b.copy())
  local, optimizers = {}, {}
  for clients in rounds:
    moves = []
    for idx, batches in clients:
      x = list(local.get(idx, center))
      opt = optimizers.setdefault(idx, reference.Momentum(lr, momentum))
      for xb, yb in reference.real_batches(batches):
        g = reference.mean_grad(x, xb, yb)
        x = opt.apply(x, [gv + rho * (v - c) for gv, v, c in zip(g, x, center)])
      d = (x[0] - center[0], x[1] - center[1])
      local[idx] = (x[0] - alpha * d[0], x[1] - alpha * d[1])
      move = [alpha * d[0], alpha * d[1]]
      if encode is not None:  # the client sends -alpha d (the server subtracts it)
        move = [-encode(-m) for m in move]
      moves.append(move)
    center = (center[0] + sum(m[0] for m in moves), center[1] + sum(m[1] for m in moves))
  return center, local, optimizers


def _quantize8(value):
  """tensor_encoding's uniform quantization with deterministic rounding, decoded:
  levels between the tensor's min and max, round half to even (float32)."""
  value = np.asarray(value, np.float32)
  lo, hi = value.min(), value.max()
  scale = np.float32(255.0)
  if hi == lo:
    return np.full_like(value, lo)
  q = np.round((value - lo) / (hi - lo) * scale)
  return q / scale * (hi - lo) + lo


ENCODE_8BIT = [{"name": "encode", "encoder": "uniform", "bits": 8, "min_elements": 1,
                "rounding": "deterministic"}]


@pytest.mark.parametrize("rho", [0.0, 0.3])
def test_easgd_two_rounds_match_numpy(tff_runtime, rho):
  model = builders.task_model()
  alg = builders.algorithm("easgd", {
      "client_optimizer": {"name": "sgd", "learning_rate": 0.2},
      "moving_rate": 0.25, "rho": rho, "communication_period": 3}, model)
  assert alg.client_plan.steps == 3
  round1 = _clients(11, [(3, 0), (3, 1)])
  round2 = _clients(12, [(3, 0), (3, 0)])
  schedule = [[(0, round1[0]), (1, round1[1])], [(1, round2[0]), (2, round2[1])]]
  trained, stored = _run_stateful(alg, schedule)
  w, b = [np.array(v) for v in model.initial_weights.trainable]
  center, local, _ = _easgd_reference(w, b, schedule, alpha=0.25, rho=rho, lr=0.2)
  np.testing.assert_allclose(trained[0], center[0], atol=1e-5)
  np.testing.assert_allclose(trained[1], center[1], atol=1e-5)
  for idx in (0, 1, 2):
    np.testing.assert_allclose(stored[idx]["weights"][0], local[idx][0], atol=1e-5)
    assert float(stored[idx]["initialized"]) == 1.0


def test_easgd_defaults_are_tensorflows():
  """ElasticAverageOptimizer: moving_rate = 0.9 / period / workers,
  rho = moving_rate / learning rate; workers = clients_per_round."""
  from fedsim.algorithms import ALGORITHMS
  from fedsim.config.typed import parse
  entry = ALGORITHMS.get("easgd")
  params = parse(entry.params, {"client_optimizer": {"name": "adam", "learning_rate": 0.02},
                                "communication_period": 4})
  alpha, rho = params.resolved(clients_per_round=5)
  assert alpha == pytest.approx(0.9 / 4 / 5) and rho == pytest.approx(0.9 / 4 / 5 / 0.02)
  given = parse(entry.params, {"moving_rate": 0.3, "rho": 0.0})
  assert given.resolved(clients_per_round=5) == (0.3, 0.0)


def test_easgd_with_default_rates_matches_numpy(tff_runtime):
  model = builders.task_model()
  alg = builders.algorithm("easgd", {"client_optimizer": {"name": "sgd", "learning_rate": 0.2},
                                     "communication_period": 3}, model, clients_per_round=2)
  round1 = _clients(31, [(3, 0), (3, 1)])
  schedule = [[(0, round1[0]), (1, round1[1])]]
  state = alg.process.initialize()
  state, _, _ = alg.process.next(state, round1, [alg.initial_client_state] * 2)
  w, b = [np.array(v) for v in model.initial_weights.trainable]
  alpha = 0.9 / 3 / 2
  center, _, _ = _easgd_reference(w, b, schedule, alpha=alpha, rho=alpha / 0.2, lr=0.2)
  trained = alg.model_weights(state).trainable
  np.testing.assert_allclose(trained[0], center[0], atol=1e-5)
  np.testing.assert_allclose(trained[1], center[1], atol=1e-5)


@pytest.mark.parametrize("aggregation", [(), ENCODE_8BIT])
def test_easgd_carries_momentum_across_rounds(tff_runtime, aggregation):
  """Client 1 takes part in both rounds: its momentum accumulator continues (and the
  elastic moves may cross the wire 8-bit quantized)."""
  model = builders.task_model()
  alg = builders.algorithm("easgd", {
      "client_optimizer": {"name": "sgd", "learning_rate": 0.2, "momentum": 0.8},
      "moving_rate": 0.25, "rho": 0.3, "communication_period": 3}, model,
      aggregation=aggregation)
  round1 = _clients(13, [(3, 0), (3, 1)])
  round2 = _clients(14, [(3, 1), (3, 0)])
  schedule = [[(0, round1[0]), (1, round1[1])], [(1, round2[0]), (2, round2[1])]]
  trained, stored = _run_stateful(alg, schedule)
  w, b = [np.array(v) for v in model.initial_weights.trainable]
  encode = _quantize8 if aggregation else None
  center, local, optimizers = _easgd_reference(w, b, schedule, alpha=0.25, rho=0.3, lr=0.2,
                                               momentum=0.8, encode=encode)
  np.testing.assert_allclose(trained[0], center[0], atol=1e-5)
  np.testing.assert_allclose(trained[1], center[1], atol=1e-5)
  for idx in (0, 1, 2):
    np.testing.assert_allclose(stored[idx]["weights"][0], local[idx][0], atol=1e-5)
    np.testing.assert_allclose(stored[idx]["optimizer_state"]["accumulator"][0],
                               optimizers[idx].accum[0], atol=1e-5)
  # Restarting client 1's momentum in round 2 would give another center.
  fresh, _, _ = _easgd_reference(w, b, [schedule[0], [(3, round2[0]), (2, round2[1])]],
                                 alpha=0.25, rho=0.3, lr=0.2, momentum=0.8, encode=encode)
  assert np.abs(fresh[0] - center[0]).max() > 1e-4


def _union(client):
  real = client["mask"] > 0
  return client["x"][real], client["y"][real]


@pytest.mark.parametrize("weighting,aggregation", [
    ("uniform", ()), ("uniform", ENCODE_8BIT), ("num_examples", ENCODE_8BIT)])
def test_fedsgd_weighting_and_compression_match_numpy(tff_runtime, weighting, aggregation):
  """The server steps on sum_i n_i Q(g_i) / sum_i n_i, n_i = 1 or examples; TFF's mean
  multiplies by the weight before the (encoded) sum, so Q applies to n_i g_i."""
  model = builders.task_model()
  alg = builders.algorithm("fedsgd", {"server_optimizer": {"name": "sgd", "learning_rate": 0.5},
                                      "client_weighting": weighting}, model,
                           aggregation=aggregation)
  data = _clients(4, [(2, 1), (3, 0), (1, 1)])
  state, _ = alg.process.next(alg.process.initialize(), data)
  w, b = [np.array(v) for v in model.initial_weights.trainable]
  total, weights = [0.0, 0.0], 0.0
  for client in data:
    x, y = _union(client)
    n = 1.0 if weighting == "uniform" else float(len(y))
    g = reference.mean_grad([w, b], x, y)
    sent = [n * gv for gv in g]
    if aggregation:
      sent = [_quantize8(v) for v in sent]
    total = [t + v for t, v in zip(total, sent)]
    weights += n
  trained = alg.model_weights(state).trainable
  np.testing.assert_allclose(trained[0], w - 0.5 * total[0] / weights, atol=1e-6)
  np.testing.assert_allclose(trained[1], b - 0.5 * total[1] / weights, atol=1e-6)
  if weighting == "uniform" and not aggregation:  # not the union's gradient any more
    union = reference.mean_grad([w, b], *map(np.concatenate, zip(*map(_union, data))))
    assert np.abs(trained[0] - (w - 0.5 * union[0])).max() > 1e-4
