"""FedBuff's server update as a TFF process, against NumPy references of the paper's
Algorithm 1 (Nguyen et al. 2022): clients train on the version they downloaded,
the server sums w(s_i) Delta_i over a buffer of K and divides by K (or normalizes
by the weights), then applies its optimizer."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from fedsim.errors import UserError
from fedsim.learning.buffered import arrival
from tests.learning import builders, reference
from tests.learning.test_fedavg import _clients

# The paper's staleness functions, written out (not fedsim's registry).
PAPER_WEIGHTS = {
    "constant": lambda s: 1.0,
    "sqrt": lambda s: 1.0 / np.sqrt(1.0 + s),
    "polynomial": lambda s: (1.0 + s) ** -1.5,
}
STALENESS = {"constant": {"name": "constant"}, "sqrt": {"name": "sqrt"},
             "polynomial": {"name": "polynomial", "exponent": 1.5}}


def _synthetic(updates, weights, staleness):
  return [collections.OrderedDict(
      update=tuple(np.asarray(u, np.float32) for u in update),
      update_weight=np.float32(n),
      stats=collections.OrderedDict(loss_sum=np.float32(1.0), correct=np.float32(0.0),
                                    num_examples=np.float32(n)),
      staleness=np.float32(s)) for update, n, s in zip(updates, weights, staleness)]


@pytest.mark.parametrize("staleness", sorted(PAPER_WEIGHTS))
@pytest.mark.parametrize("normalize,weighting", [("buffer_size", "uniform"),
                                                 ("total_weight", "uniform"),
                                                 ("total_weight", "num_examples")])
def test_server_update_weighs_buffered_updates_by_staleness(tff_runtime, staleness, normalize,
                                                            weighting):
  model = builders.task_model()
  alg = builders.algorithm("fedbuff", {
      "server_optimizer": {"name": "sgd", "learning_rate": 0.7},
      "staleness": STALENESS[staleness], "normalize": normalize,
      "client_weighting": weighting}, model, clients_per_round=3)
  rng = np.random.default_rng(0)
  w0, b0 = [np.array(v) for v in model.initial_weights.trainable]
  deltas = [(rng.normal(size=w0.shape), rng.normal(size=b0.shape)) for _ in range(3)]
  examples, ages = [4.0, 1.0, 6.0], [0, 2, 5]
  counts = examples if weighting == "num_examples" else [1.0, 1.0, 1.0]
  state, measurements = alg.process.next(alg.process.initialize(),
                                         _synthetic(deltas, counts, ages))
  c = [PAPER_WEIGHTS[staleness](s) for s in ages]
  if normalize == "buffer_size":
    coef = [ci / 3 for ci in c]
  else:
    coef = [ci * n / sum(cj * m for cj, m in zip(c, counts)) for ci, n in zip(c, counts)]
  got = [np.asarray(v) for v in alg.model_weights(state).trainable]
  for i, x0 in enumerate((w0, b0)):
    want = x0 - 0.7 * sum(k * d[i] for k, d in zip(coef, deltas))
    np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-6)
  assert float(measurements["client_work"]["num_examples"]) == sum(counts)


def test_clients_train_on_the_version_they_downloaded(tff_runtime):
  """A toy schedule, K = 2: A, B, C download x0; A and B arrive -> x1; D downloads
  x1; C (s = 1) and D (s = 0) arrive -> x2; E downloads x2; E (s = 0) and F (who
  downloaded x0, s = 2) arrive -> x3. Server SGD 1.0, w(s) = 1/sqrt(1+s), / K."""
  model = builders.task_model()
  alg = builders.algorithm("fedbuff", {
      "client_optimizer": {"name": "sgd", "learning_rate": 0.4},
      "staleness": {"name": "sqrt"}}, model, clients_per_round=2)
  data = dict(zip("ABCDEF", _clients(3, [(2, 0), (3, 1), (1, 1), (2, 1), (4, 0), (1, 0)])))
  # (client, version it downloaded, version at arrival), per server update.
  schedule = [[("A", 0, 0), ("B", 0, 0)], [("C", 0, 1), ("D", 1, 1)],
              [("E", 2, 2), ("F", 0, 2)]]

  versions = [alg.process.initialize()]
  for update in schedule:
    arrivals = [arrival(alg.dispatch_process.next(versions[v], [data[c]])[2][0],
                        staleness=now - v) for c, v, now in update]
    state, _ = alg.process.next(versions[-1], arrivals)
    versions.append(state)

  x = [[np.array(v) for v in model.initial_weights.trainable]]
  for update in schedule:
    w, b = x[-1]
    step_w, step_b = np.zeros_like(w), np.zeros_like(b)
    for c, v, now in update:
      wi, bi = reference.local_sgd(*x[v], data[c], 0.4)
      scale = 1.0 / np.sqrt(1.0 + now - v) / 2
      step_w += scale * (x[v][0] - wi)
      step_b += scale * (x[v][1] - bi)
    x.append([w - step_w, b - step_b])
  for got, want in zip(versions[1:], x[1:]):
    for g, r in zip(alg.model_weights(got).trainable, want):
      np.testing.assert_allclose(np.asarray(g), r, atol=1e-5)


def test_example_weighting_needs_total_weight_normalization():
  with pytest.raises(UserError, match="client_weighting: num_examples needs normalize"):
    builders.algorithm("fedbuff", {"client_weighting": "num_examples"},
                       builders.task_model())
