"""FedProx (Li et al. 2020) against a NumPy reference of its proximal local objective.

The reference adds mu (v - w^t) to each local gradient, the paper's sign; TFF 0.87's
`build_weighted_fed_prox` uses mu (w^t - v), so it is not the reference here."""

from __future__ import annotations

import numpy as np
import pytest

from tests.learning import builders, reference
from tests.learning.test_fedavg import _clients, _run


def _fedprox_reference(w, b, rounds, lr, mu, momentum=0.0):
  """Each client: SGD (heavy-ball) on F_i(v) + mu/2 ||v - w^t||^2 from w^t; server:
  example-weighted mean of the client models."""
  params = [w.astype(np.float64), b.astype(np.float64)]
  for clients in rounds:
    models, counts = [], []
    for batches in clients:
      received = [p.copy() for p in params]
      local = [p.copy() for p in params]
      opt = reference.Momentum(lr, momentum)
      for x, y in reference.real_batches(batches):
        grads = [g + mu * (v - r) for g, v, r in
                 zip(reference.mean_grad(local, x, y), local, received)]
        local = opt.apply(local, grads)
      models.append(local)
      counts.append(batches["mask"].sum())
    params = [sum(n * m[j] for n, m in zip(counts, models)) / sum(counts) for j in range(2)]
  return params


ROUNDS = [_clients(41, [(3, 1), (2, 0), (4, 1)]), _clients(42, [(2, 1), (3, 0)])]


@pytest.mark.parametrize("mu,momentum", [(0.5, 0.0), (2.0, 0.9)])
def test_fedprox_two_rounds_match_numpy(tff_runtime, mu, momentum):
  model = builders.task_model()
  alg = builders.algorithm("fedprox", {
      "client_optimizer": {"name": "sgd", "learning_rate": 0.3, "momentum": momentum},
      "mu": mu}, model)
  weights, _ = _run(alg, ROUNDS)
  w, b = [np.array(v) for v in model.initial_weights.trainable]
  expected = _fedprox_reference(w, b, ROUNDS, 0.3, mu, momentum)
  np.testing.assert_allclose(weights[0], expected[0], atol=1e-5)
  np.testing.assert_allclose(weights[1], expected[1], atol=1e-5)
  # The proximal term matters at this mu: FedAvg's reference is elsewhere.
  fedavg = _fedprox_reference(w, b, ROUNDS, 0.3, 0.0, momentum)
  assert np.abs(fedavg[0] - expected[0]).max() > 1e-3


def test_fedprox_with_mu_zero_is_fedavg_exactly(tff_runtime):
  model = builders.task_model()
  params = {"client_optimizer": {"name": "adam", "learning_rate": 0.05},
            "server_optimizer": {"name": "sgd", "learning_rate": 0.7, "momentum": 0.5},
            "client_weighting": "uniform", "gradient_accumulation": {"steps": 2}}
  prox, _ = _run(builders.algorithm("fedprox", dict(params, mu=0.0), model), ROUNDS)
  avg, _ = _run(builders.algorithm("fedavg", params, model), ROUNDS)
  for p, a in zip(prox, avg):
    np.testing.assert_array_equal(p, a)
