"""`synthetic`: Synthetic(alpha, beta) of LEAF / FedProx (Li et al. 2020).

Client k has its own softmax-regression model and feature distribution:

  u_k ~ N(0, alpha^2),  W_k ~ N(u_k, 1) [d, C],  b_k ~ N(u_k, 1) [C]
  B_k ~ N(0, beta^2),   v_k ~ N(B_k, 1) [d],     x ~ N(v_k, diag(j^-1.2))
  y = argmax(x W_k + b_k)

so alpha sets how much the clients' models differ and beta how much their
inputs differ (alpha and beta are standard deviations, as in the reference
generator). Note, as specified: u_k shifts every class's logit by the same
u_k (sum(x) + 1), so alpha leaves the labels unchanged; only beta (and the
per-client N(0, 1) draws themselves) make clients differ. `iid: true` gives every client the same W, b ~ N(0, 1) and
v = 0. Client sizes are heavy-tailed as in the reference: 50 + floor(e^Z)
with Z ~ N(4, 2^2). Each client keeps a `test_fraction` share of its examples
for the centralized held-out set. Client k depends only on (seed, k), and
training clients are generated when read.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedsim.config.typed import bounded
from fedsim.data import DATASETS
from fedsim.data.federated import ClientBatching, Examples, FederatedData
from fedsim.data.lazy_clients import generated_clients
from fedsim.seeds import GENERATE_STREAM, LEAF_CLIENT_SUBSTREAM, LEAF_SHARED_SUBSTREAM

MIN_CLIENT_EXAMPLES = 50
_SIZE_LOG_MEAN, _SIZE_LOG_STDDEV = 4.0, 2.0
_COVARIANCE_POWER = -1.2


@dataclasses.dataclass(frozen=True)
class SyntheticParams(ClientBatching):
  num_clients: int = bounded(30, min=1)
  alpha: float = bounded(1.0, min=0, used_with=("iid", False))  # spread of the clients' models
  beta: float = bounded(1.0, min=0, used_with=("iid", False))  # spread of their feature means
  iid: bool = False  # one shared model and feature distribution (ignores alpha, beta)
  dimension: int = bounded(60, min=1)
  num_classes: int = bounded(10, min=2)
  test_fraction: float = bounded(0.2, min=0, max=0.9)  # of each client, held out
  batch_size: int = bounded(10, min=1)


def client_size(seed: int, client: int) -> int:
  """Examples generated for `client` before the held-out share is removed."""
  rng = np.random.default_rng([seed, GENERATE_STREAM, LEAF_CLIENT_SUBSTREAM, client, 0])
  return MIN_CLIENT_EXAMPLES + int(rng.lognormal(_SIZE_LOG_MEAN, _SIZE_LOG_STDDEV))


def generate_client(params: SyntheticParams, seed: int, client: int) -> Examples:
  """All of one client's examples: x float32 [n, dimension], y int32 [n]."""
  d, classes = params.dimension, params.num_classes
  rng = np.random.default_rng([seed, GENERATE_STREAM, LEAF_CLIENT_SUBSTREAM, client, 1])
  if params.iid:
    shared = np.random.default_rng([seed, GENERATE_STREAM, LEAF_SHARED_SUBSTREAM])
    weights, bias = shared.normal(0, 1, (d, classes)), shared.normal(0, 1, classes)
    mean = np.zeros(d)
  else:
    u, b_mean = rng.normal(0, params.alpha), rng.normal(0, params.beta)
    weights, bias = rng.normal(u, 1, (d, classes)), rng.normal(u, 1, classes)
    mean = rng.normal(b_mean, 1, d)
  n = client_size(seed, client)
  stddev = np.arange(1, d + 1) ** (_COVARIANCE_POWER / 2)
  x = mean + rng.standard_normal((n, d)) * stddev
  y = np.argmax(x @ weights + bias, axis=1)
  return Examples(x.astype(np.float32), y.astype(np.int32))


def _held(params: SyntheticParams, n: int) -> int:
  """How many of a client's n generated examples go to the held-out set (the last ones)."""
  return int(round(params.test_fraction * n))


def _train_part(params: SyntheticParams, seed: int, client: int) -> Examples:
  examples = generate_client(params, seed, client)
  # Generated i.i.d. within a client, so the last `held` are a random share.
  return examples.take(np.arange(len(examples) - _held(params, len(examples))))


@DATASETS.register("synthetic", params=SyntheticParams)
def build(params: SyntheticParams, seed: int, *, key: str = "data") -> FederatedData:
  """LEAF / FedProx Synthetic(alpha, beta): per-client softmax models, power-law sizes.

  Training clients are generated again when read (`generated_clients`);
  the held-out shares are generated here, pooled into `test`, and each
  client's own test split is a view of it.
  """
  del key  # every parameter combination is feasible
  held_out = []
  for k in range(params.num_clients):
    examples = generate_client(params, seed, k)
    held_out.append(examples.take(np.arange(len(examples) - _held(params, len(examples)),
                                            len(examples))))
  test_set = Examples(np.concatenate([t.x for t in held_out]),
                      np.concatenate([t.y for t in held_out]))
  ends = np.cumsum([len(t) for t in held_out])
  del held_out
  clients = generated_clients(
      params.num_clients, lambda k: _train_part(params, seed, k),
      size=lambda k: client_size(seed, k) - _held(params, client_size(seed, k)),
      max_examples_per_client=params.max_examples_per_client, seed=seed)
  # Each client's held-out share is its own test split (per-client evaluation).
  client_test = {cid: Examples(test_set.x[end - count:end], test_set.y[end - count:end])
                 for cid, end, count in zip(clients, ends, np.diff(ends, prepend=0))}
  return FederatedData(clients, test_set, tuple(test_set.x.shape[1:]), params.num_classes,
                       client_test=client_test)
