"""FedSGD and elastic averaging as TFF processes, against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

from tests.learning import builders, reference
from tests.learning.test_fedavg import _clients


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


def _easgd_reference(w, b, rounds, alpha, rho, lr):
  """Center and local models after `rounds` of [(client index, batches)]."""
  center = (w.copy(), b.copy())
  local = {}
  for clients in rounds:
    moves = []
    for idx, batches in clients:
      x = local.get(idx, center)
      x = (x[0].copy(), x[1].copy())
      for i in range(len(batches["mask"])):
        gw, gb = reference.batch_grad(x[0], x[1], batches["x"][i], batches["y"][i],
                                      batches["mask"][i])
        gw, gb = gw + rho * (x[0] - center[0]), gb + rho * (x[1] - center[1])
        x = (x[0] - lr * gw, x[1] - lr * gb)
      d = (x[0] - center[0], x[1] - center[1])
      local[idx] = (x[0] - alpha * d[0], x[1] - alpha * d[1])
      moves.append((alpha * d[0], alpha * d[1]))
    center = (center[0] + sum(m[0] for m in moves), center[1] + sum(m[1] for m in moves))
  return center, local


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

  stored = {}
  state = alg.process.initialize()
  for clients in schedule:
    ids = [idx for idx, _ in clients]
    states = [stored.get(i, alg.initial_client_state) for i in ids]
    state, _, new_states = alg.process.next(state, [c for _, c in clients], states)
    stored.update(zip(ids, new_states))

  w, b = [np.array(v) for v in model.initial_weights.trainable]
  center, local = _easgd_reference(w, b, schedule, alpha=0.25, rho=rho, lr=0.2)
  trained = alg.model_weights(state).trainable
  np.testing.assert_allclose(trained[0], center[0], atol=1e-5)
  np.testing.assert_allclose(trained[1], center[1], atol=1e-5)
  for idx in (0, 1, 2):
    np.testing.assert_allclose(stored[idx]["weights"][0], local[idx][0], atol=1e-5)
    assert float(stored[idx]["initialized"]) == 1.0


def test_easgd_defaults_are_tensorflows():
  """ElasticAverageOptimizer (seed 002): moving_rate = 0.9 / period / workers,
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
  center, _ = _easgd_reference(w, b, schedule, alpha=alpha, rho=alpha / 0.2, lr=0.2)
  trained = alg.model_weights(state).trainable
  np.testing.assert_allclose(trained[0], center[0], atol=1e-5)
  np.testing.assert_allclose(trained[1], center[1], atol=1e-5)
