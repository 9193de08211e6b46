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


def _run_stateful(alg, schedule):
  """Runs rounds of [(client index, batches)], keeping client states as the run loop does."""
  stored = {}
  state = alg.process.initialize()
  for clients in schedule:
    ids = [idx for idx, _ in clients]
    states = [stored.get(i, alg.initial_client_state) for i in ids]
    state, _, new_states = alg.process.next(state, [c for _, c in clients], states)
    stored.update(zip(ids, new_states))
  return [np.asarray(w) for w in alg.model_weights(state).trainable], stored


def _fedavg_reference(w, b, schedule, train_client):
  """Example-weighted FedAvg, server SGD 1.0: the mean of the trained client models."""
  params = [w, b]
  for clients in schedule:
    trained = [(train_client(idx, params, batches), batches["mask"].sum())
               for idx, batches in clients]
    total = sum(n for _, n in trained)
    params = [sum(n * t[j] for t, n in trained) / total for j in range(2)]
  return params


SCHEDULE_SEEDS = [(21, [(0, (3, 1)), (1, (2, 0))]), (22, [(1, (2, 1)), (2, (1, 0))]),
                  (23, [(0, (2, 0)), (2, (3, 1))])]


def _schedule():
  """3 rounds; clients 0, 1 and 2 each take part twice, never all together."""
  out = []
  for seed, clients in SCHEDULE_SEEDS:
    data = _clients(seed, [shape for _, shape in clients])
    out.append([(idx, d) for (idx, _), d in zip(clients, data)])
  return out


def test_kept_client_momentum_matches_comind(tff_runtime):
  """client_optimizer_state: keep (coMind's FedAvg): each client's momentum
  accumulator survives between the rounds it takes part in."""
  model = builders.task_model()
  alg = builders.algorithm("fedavg", {
      "client_optimizer": {"name": "sgd", "learning_rate": 0.3, "momentum": 0.9},
      "client_optimizer_state": "keep"}, model)
  schedule = _schedule()
  weights, stored = _run_stateful(alg, schedule)

  optimizers = {}

  def train_client(idx, params, batches):
    opt = optimizers.setdefault(idx, reference.Momentum(0.3, 0.9))
    params = [p.copy() for p in params]
    for x, y in reference.real_batches(batches):
      params = opt.apply(params, reference.mean_grad(params, x, y))
    return params

  w, b = [np.array(v, np.float64) for v in model.initial_weights.trainable]
  expected = _fedavg_reference(w, b, schedule, train_client)
  np.testing.assert_allclose(weights[0], expected[0], atol=1e-5)
  np.testing.assert_allclose(weights[1], expected[1], atol=1e-5)
  for idx in (0, 1, 2):
    accum = stored[idx]["optimizer_state"]["accumulator"]
    np.testing.assert_allclose(accum[0], optimizers[idx].accum[0], atol=1e-5)
  # Resetting momentum every round (the default) gives another model.
  reset = builders.algorithm("fedavg", {
      "client_optimizer": {"name": "sgd", "learning_rate": 0.3, "momentum": 0.9}}, model)
  assert reset.initial_client_state is None
  assert np.abs(_run(reset, [[c for _, c in r] for r in schedule])[0][0] - weights[0]).max() > 1e-3


def test_carried_accumulation_window_matches_horovod(tff_runtime):
  """remainder: carry: a client's partial window waits in its state for its next round."""
  model = builders.task_model()
  alg = builders.algorithm("fedavg", {
      "client_optimizer": {"name": "sgd", "learning_rate": 0.3},
      "gradient_accumulation": {"steps": 2, "divide_by": "backward_passes",
                                "remainder": "carry"}}, model)
  schedule = _schedule()
  weights, stored = _run_stateful(alg, schedule)

  helpers = {}

  def train_client(idx, params, batches):
    helper = helpers.setdefault(idx, reference.HorovodAggregation(2, True))
    return reference.horovod_train([p.copy() for p in params], batches, reference.Sgd(0.3),
                                   helper)

  w, b = [np.array(v, np.float64) for v in model.initial_weights.trainable]
  expected = _fedavg_reference(w, b, schedule, train_client)
  np.testing.assert_allclose(weights[0], expected[0], atol=1e-5)
  np.testing.assert_allclose(weights[1], expected[1], atol=1e-5)
  for idx in (0, 1, 2):
    assert float(stored[idx]["window"]["passes"]) == helpers[idx].counter
  assert any(h.counter for h in helpers.values())  # some window was really carried
