"""SCAFFOLD (Karimireddy et al. 2020, Algorithm 1, option II) against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from tests.learning import builders, reference
from tests.learning.test_fedavg import _run_stateful, _schedule


def _scaffold_reference(x, schedule, population, lr_l, lr_g, weighting="uniform"):
  """Algorithm 1 of the paper: returns (x, c, {client: c_i})."""
  x = [p.astype(np.float64) for p in x]
  c = [np.zeros_like(p) for p in x]
  c_clients = {}
  for clients in schedule:
    delta_y, delta_c, weights = [], [], []
    for idx, batches in clients:
      c_i = c_clients.get(idx, [np.zeros_like(p) for p in x])
      y = [p.copy() for p in x]
      steps = 0
      for xb, yb in reference.real_batches(batches):
        g = reference.mean_grad(y, xb, yb)
        y = [v - lr_l * (gv - ci + cv) for v, gv, ci, cv in zip(y, g, c_i, c)]
        steps += 1
      c_plus = [ci - cv + (xv - yv) / (steps * lr_l) for ci, cv, xv, yv in zip(c_i, c, x, y)]
      delta_y.append([yv - xv for yv, xv in zip(y, x)])
      delta_c.append([cp - ci for cp, ci in zip(c_plus, c_i)])
      weights.append(1.0 if weighting == "uniform" else batches["mask"].sum())
      c_clients[idx] = c_plus
    total = sum(weights)
    x = [xv + lr_g * sum(w * d[j] for w, d in zip(weights, delta_y)) / total
         for j, xv in enumerate(x)]
    c = [cv + sum(d[j] for d in delta_c) / population for j, cv in enumerate(c)]
  return x, c, c_clients


@pytest.mark.parametrize("weighting,lr_g", [("uniform", 1.0), ("num_examples", 0.7)])
def test_scaffold_three_rounds_with_partial_participation_match_numpy(
    tff_runtime, weighting, lr_g):
  model = builders.task_model()
  population = 4  # client 3 never takes part; each other one misses a round
  alg = builders.algorithm("scaffold", {
      "client_learning_rate": 0.3, "client_weighting": weighting,
      "server_optimizer": {"name": "sgd", "learning_rate": lr_g}}, model,
      num_clients=population)
  schedule = _schedule()
  weights, stored = _run_stateful(alg, schedule)
  x0 = [np.array(v) for v in model.initial_weights.trainable]
  x, c, c_clients = _scaffold_reference(x0, schedule, population, 0.3, lr_g, weighting)
  np.testing.assert_allclose(weights[0], x[0], atol=1e-5)
  np.testing.assert_allclose(weights[1], x[1], atol=1e-5)
  for idx in (0, 1, 2):
    for got, want in zip(stored[idx]["control_variate"], c_clients[idx]):
      np.testing.assert_allclose(got, want, atol=1e-5)
  # The server's control variate is the mean of all N clients' (unseen ones are 0).
  for j in range(2):
    np.testing.assert_allclose(c[j], sum(c_clients[i][j] for i in c_clients) / population,
                               atol=1e-12)
  # The correction matters: FedAvg on the same schedule lands elsewhere.
  fedavg = builders.algorithm("fedavg", {"client_optimizer": {"name": "sgd",
                                                              "learning_rate": 0.3},
                                         "client_weighting": weighting,
                                         "server_optimizer": {"name": "sgd",
                                                              "learning_rate": lr_g}}, model)
  from tests.learning.test_fedavg import _run
  plain, _ = _run(fedavg, [[b for _, b in r] for r in schedule])
  assert np.abs(plain[0] - weights[0]).max() > 1e-3


def test_scaffold_sends_the_control_variate_both_ways():
  """Sized from the compiled round: c down with the model, Delta c up with Delta y."""
  from fedsim.sizing.mapreduce_form import client_wire_bits
  model = builders.task_model("logistic", (64,), 10)
  alg = builders.algorithm("scaffold", {}, model, num_clients=10)
  wire = client_wire_bits(alg.sizing_process, alg.upload_extras_types)
  fedavg = builders.algorithm("fedavg", {"client_weighting": "uniform"}, model)
  plain = client_wire_bits(fedavg.process, fedavg.upload_extras_types)
  params = 64 * 10 + 10
  assert plain.broadcast == params * 32
  assert wire.broadcast == 2 * params * 32
  assert wire.aggregate_model - plain.aggregate_model == params * 32
  assert wire.aggregate - wire.aggregate_model == 3 * 32  # the training metric sums


def test_scaffold_needs_the_population():
  from fedsim.errors import UserError
  with pytest.raises(UserError, match="scaffold needs the number of clients"):
    builders.algorithm("scaffold", {}, builders.task_model())


@pytest.mark.slow
def test_scaffold_resumes_exactly_with_compressed_updates(tff_runtime, tmp_path):
  """Server control variate in the checkpoint, client ones on disk: 2 rounds + 1
  resumed round equal 3 rounds straight, with 8-bit updates through the chain."""
  import fedsim
  config = {
      "name": "scaffold", "seed": 3, "rounds": 3, "clients_per_round": 3,
      "data": {"name": "digits", "num_clients": 6, "partition": "dirichlet", "alpha": 0.5},
      "model": {"name": "logistic"},
      "algorithm": {"name": "scaffold", "client_learning_rate": 0.05},
      "aggregation": [{"name": "encode", "encoder": "uniform", "bits": 8, "min_elements": 1}],
  }
  straight = fedsim.run(config, logdir=tmp_path / "a")
  first = fedsim.run(config, ["rounds=2"], logdir=tmp_path / "b")
  resumed = fedsim.run(config, ["rounds=3"], logdir=tmp_path / "b", resume=first.run_dir)
  assert resumed.run_dir == first.run_dir
  for a, b in zip(straight.final_weights, resumed.final_weights):
    np.testing.assert_array_equal(a, b)
  assert any((first.run_dir / "client_states").iterdir())
  row = straight.metrics[0]
  assert row["aggregate_model_bits_per_client"] < row["broadcast_bits_per_client"]  # encoded
