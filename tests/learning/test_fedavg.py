"""FedAvg as a TFF process, against a NumPy reference of its update rule."""

from __future__ import annotations

import numpy as np
import pytest

from tests.learning import builders, reference


def _clients(seed, sizes, batch=2, dim=3, classes=2):
  rng = np.random.default_rng(seed)
  out = []
  for steps, pad in sizes:
    mask = np.ones((steps, batch), np.float32)
    if pad:
      mask[-1, -pad:] = 0.0
    out.append({"x": rng.normal(size=(steps, batch, dim)).astype(np.float32),
                "y": rng.integers(0, classes, (steps, batch)).astype(np.int32),
                "mask": mask})
  return out


def _run(alg, rounds_data):
  state = alg.process.initialize()
  metrics = []
  for data in rounds_data:
    state, m = alg.process.next(state, data)
    metrics.append(m)
  return [np.asarray(w) for w in alg.model_weights(state).trainable], metrics


@pytest.mark.parametrize("weighting,server_lr", [("num_examples", 1.0), ("num_examples", 0.7),
                                                  ("uniform", 1.0)])
def test_fedavg_two_rounds_match_numpy(tff_runtime, weighting, server_lr):
  model = builders.task_model()
  alg = builders.algorithm("fedavg", {
      "client_optimizer": {"name": "sgd", "learning_rate": 0.4},
      "server_optimizer": {"name": "sgd", "learning_rate": server_lr},
      "client_weighting": weighting}, model)
  rounds = [_clients(1, [(2, 0), (3, 1), (1, 1)]), _clients(2, [(1, 0), (4, 0)])]
  weights, metrics = _run(alg, rounds)

  w, b = [np.array(v) for v in model.initial_weights.trainable]
  for data in rounds:
    deltas, counts = [], []
    for client in data:
      wi, bi = reference.local_sgd(w, b, client, 0.4)
      deltas.append((w - wi, b - bi))
      counts.append(client["mask"].sum() if weighting == "num_examples" else 1.0)
    total = sum(counts)
    dw = sum(c * d[0] for c, d in zip(counts, deltas)) / total
    db = sum(c * d[1] for c, d in zip(counts, deltas)) / total
    w, b = w - server_lr * dw, b - server_lr * db
  np.testing.assert_allclose(weights[0], w, atol=1e-5)
  np.testing.assert_allclose(weights[1], b, atol=1e-5)
  assert float(metrics[0]["client_work"]["num_examples"]) == 4 + 5 + 1
  assert float(metrics[1]["client_work"]["num_examples"]) == 2 + 8


def test_uniform_weighting_is_plain_mean_of_client_models(tff_runtime):
  """Server SGD lr 1, no momentum, uniform weights: w' = mean_i(w_i)."""
  model = builders.task_model()
  alg = builders.algorithm("fedavg", {
      "client_optimizer": {"name": "sgd", "learning_rate": 0.3},
      "client_weighting": "uniform"}, model)
  data = _clients(5, [(1, 1), (5, 0)])
  weights, _ = _run(alg, [data])
  w, b = [np.array(v) for v in model.initial_weights.trainable]
  trained = [reference.local_sgd(w, b, c, 0.3) for c in data]
  np.testing.assert_allclose(weights[0], np.mean([t[0] for t in trained], axis=0), atol=1e-6)
  np.testing.assert_allclose(weights[1], np.mean([t[1] for t in trained], axis=0), atol=1e-6)


def test_train_metrics_are_example_weighted(tff_runtime):
  model = builders.task_model()
  alg = builders.algorithm("fedavg", {"client_optimizer": {"name": "sgd", "learning_rate": 0.1}},
                           model)
  data = _clients(9, [(2, 1), (1, 0)])
  _, metrics = _run(alg, [data])
  w, b = [np.array(v) for v in model.initial_weights.trainable]
  losses, n = 0.0, 0
  for client in data:  # loss of each batch at the weights before its step
    wi, bi = w.copy(), b.copy()
    for i in range(len(client["mask"])):
      real = client["mask"][i] > 0
      x, y = client["x"][i][real], client["y"][i][real]
      losses += reference.mean_loss(wi, bi, x, y) * len(y)
      n += len(y)
      wi, bi = reference.local_sgd(wi, bi, {k: v[i:i + 1] for k, v in client.items()}, 0.1)
  np.testing.assert_allclose(float(metrics[0]["client_work"]["loss"]), losses / n, rtol=1e-5)
