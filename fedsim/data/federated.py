"""The container every dataset builds: per-client examples plus a held-out test set.

Also the config parameters that every dataset shares: how a centralized
dataset is split over clients (`Partitioning`) and how a client turns its
examples into local training batches (`ClientBatching`). Populations loaded
or generated on access are `fedsim.data.lazy_clients`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterator, Mapping, Sequence

import numpy as np

from fedsim.config.typed import bounded, choice
from fedsim.data.partition import PARTITIONERS
from fedsim.seeds import CAP_STREAM, DESCRIBE_STREAM, HOLDOUT_STREAM

MIN_DIRICHLET_ALPHA = 1e-6

DESCRIBE_CLIENTS = 1000  # lazy clients `describe` reads at most (without cheap labels)

_QUANTILES = {"min": 0.0, "p10": 0.1, "median": 0.5, "p90": 0.9, "max": 1.0}


@dataclasses.dataclass(frozen=True, eq=False)
class Examples:
  """One client's (or the test set's) examples.

  Attributes:
    x: float32 features, shape [n, *input_shape].
    y: int32 labels, shape [n].
  """

  x: np.ndarray
  y: np.ndarray

  def __post_init__(self):
    if len(self.x) != len(self.y):
      raise ValueError(f"x has {len(self.x)} examples but y has {len(self.y)}")

  def __len__(self) -> int:
    return len(self.y)

  def take(self, indices: np.ndarray) -> Examples:
    """The examples at `indices`, in that order."""
    return Examples(self.x[indices], self.y[indices])

  def capped(self, max_examples: int | None, rng: np.random.Generator) -> Examples:
    """At most `max_examples` examples chosen uniformly without replacement.

    Returns `self` when there is no cap or the cap is not binding; otherwise a
    random subset that keeps the original order.
    """
    kept = cap_indices(len(self), max_examples, rng)
    return self if kept is None else self.take(kept)


def label_outside(y: np.ndarray, num_classes: int | None) -> int | None:
  """A label of `y` that is no class 0..num_classes-1 (the lowest if negative,
  else the highest), or None; num_classes None: only negatives are outside."""
  if not np.size(y):
    return None
  low, high = int(np.min(y)), int(np.max(y))
  if low < 0:
    return low
  return high if num_classes is not None and high >= num_classes else None


def cap_indices(n: int, max_examples: int | None, rng: np.random.Generator) -> np.ndarray | None:
  """Which of n examples `Examples.capped` keeps (sorted), or None when it keeps all."""
  if max_examples is None or n <= max_examples:
    return None
  return np.sort(rng.choice(n, max_examples, replace=False))


@dataclasses.dataclass(frozen=True, eq=False)
class FederatedData:
  """Client datasets plus a centralized test set no client ever trains on.

  Attributes:
    clients: client id -> examples, ordered by client id.
    test: the held-out test set.
    input_shape: shape of one example's features, e.g. (64,).
    num_classes: labels are in [0, num_classes).
    pad_label: for sequence targets, the label of padding positions, which
      then count in neither loss nor accuracy; None when every label is real.
    client_test: client id -> that client's own test examples, for datasets
      that ship per-client test splits; None when there are none (per-client
      evaluation then holds out a share of each client, see `with_holdout`).
  """

  clients: Mapping[str, Examples]
  test: Examples
  input_shape: tuple[int, ...]
  num_classes: int
  pad_label: int | None = None
  client_test: Mapping[str, Examples] | None = None

  @functools.cached_property
  def client_ids(self) -> tuple[str, ...]:
    """Every client id, in order (computed once: populations can be large)."""
    return tuple(self.clients)

  @functools.cached_property
  def client_index(self) -> dict[str, int]:
    """Client id -> its position in `client_ids` (what per-client seeds use)."""
    return {cid: i for i, cid in enumerate(self.client_ids)}

  def client_size(self, client_id: str) -> int:
    """Number of training examples of `client_id` (see `num_examples`)."""
    return num_examples(self.clients, client_id)

  def describe(self) -> dict:
    """Summary statistics for logs and the CLI.

    Sizes come from `num_examples` and labels from a lazy population's
    `labels` where it has them, so describing 100,000 generated clients
    builds no features. A lazy population without cheap labels (and over
    DESCRIBE_CLIENTS clients) counts labels on a seeded sample of
    DESCRIBE_CLIENTS clients instead of loading every client.

    Returns:
      A plain dict: `num_clients`, `total_examples` (over clients),
      `test_examples`, `input_shape`, `num_classes`, quantiles
      (min/p10/median/p90/max) of `examples_per_client` and of
      `labels_per_client` (distinct labels a client holds), and
      `labels_sampled_clients`: how many clients the label quantiles
      come from when sampled, else None.
    """
    ids = self.client_ids
    sizes = np.array([self.client_size(c) for c in ids])
    labels_of = getattr(self.clients, "labels", None)
    sampled = None
    if labels_of is None:
      labels_of = lambda cid: self.clients[cid].y  # noqa: E731
      if not isinstance(self.clients, dict) and len(ids) > DESCRIBE_CLIENTS:
        rng = np.random.default_rng([0, DESCRIBE_STREAM])
        ids = [ids[i] for i in np.sort(rng.choice(len(ids), DESCRIBE_CLIENTS, replace=False))]
        sampled = DESCRIBE_CLIENTS
    labels = np.array([len(np.unique(labels_of(c))) for c in ids])
    return {
        "num_clients": len(self.clients),
        "total_examples": int(sizes.sum()),
        "test_examples": len(self.test),
        "input_shape": list(self.input_shape),
        "num_classes": self.num_classes,
        "examples_per_client": _quantiles(sizes),
        "labels_per_client": _quantiles(labels),
        "labels_sampled_clients": sampled,
    }


def num_examples(clients: Mapping[str, Examples], client_id: str) -> int:
  """`len(clients[client_id])`, without building the examples when `clients` knows sizes.

  A lazy client mapping may define `num_examples(client_id)` (generated
  datasets compute it from their parameters); any other mapping is read.

  Raises:
    KeyError: for an unknown client id.
  """
  sized = getattr(clients, "num_examples", None)
  return sized(client_id) if sized is not None else len(clients[client_id])


def _quantiles(values: np.ndarray) -> dict[str, float]:
  return {name: float(np.quantile(values, q)) for name, q in _QUANTILES.items()}


def client_ids(num_clients: int) -> list[str]:
  """Ids "client_0000", ... zero-padded so that string order is numeric order."""
  width = max(4, len(str(num_clients - 1)))
  return [f"client_{i:0{width}d}" for i in range(num_clients)]


def client_number(client_id: str) -> int:
  """The inverse of `client_ids`: "client_0042" -> 42 (the id is not checked)."""
  return int(client_id.rsplit("_", 1)[1])


@dataclasses.dataclass(frozen=True)
class ClientBatching:
  """How each client turns its examples into local training batches."""

  batch_size: int = bounded(16, min=1)
  epochs: int = bounded(1, min=1)  # local epochs per round
  # Applied after partitioning, seeded; None keeps every example.
  max_examples_per_client: int | None = bounded(None, min=1)
  shuffle: bool = True


@dataclasses.dataclass(frozen=True)
class Partitioning:
  """How a centralized dataset's training part is split over clients."""

  num_clients: int = bounded(40, min=1)
  partition: str = choice(PARTITIONERS, "iid")  # iid | dirichlet | shards | a plugin's
  # Dirichlet concentration over clients, per label. At 1e-6 each label already
  # goes to one client; below ~1e-8 NumPy's Dirichlet sampler stalls (0.3 s a
  # draw at 1e-9, no end at 1e-30), hence the floor.
  alpha: float = bounded(0.5, min=MIN_DIRICHLET_ALPHA, used_with=("partition", "dirichlet"))
  # Label-sorted shards per client (McMahan et al. 2017).
  shards_per_client: int = bounded(2, min=1, used_with=("partition", "shards"))
  min_examples_per_client: int = bounded(1, min=1)


def federate(parts: Sequence[Examples], test: Examples, *, num_classes: int,
             max_examples_per_client: int | None, seed: int) -> FederatedData:
  """Names the clients and applies the per-client cap.

  Args:
    parts: one `Examples` per client, in client order.
    test: the held-out test set.
    num_classes: number of labels.
    max_examples_per_client: cap on each client's examples, or None.
    seed: run seed; client i's cap draws from stream [seed, CAP_STREAM, i].

  Returns:
    The `FederatedData`; `input_shape` is taken from `test.x`.
  """
  clients = {
      cid: part.capped(max_examples_per_client, np.random.default_rng([seed, CAP_STREAM, i]))
      for i, (cid, part) in enumerate(zip(client_ids(len(parts)), parts))
  }
  return FederatedData(clients, test, tuple(test.x.shape[1:]), num_classes)


class _HeldOut(Mapping[str, Examples]):
  """One side of each client's seeded train / held-out split, computed on access."""

  def __init__(self, clients: Mapping[str, Examples], fraction: float, seed: int,
               held_out: bool):
    self._clients, self._fraction, self._seed = clients, fraction, seed
    self._held_out = held_out
    self._index = {cid: i for i, cid in enumerate(clients)}

  def _held(self, n: int) -> int:
    # Every client keeps at least one training example.
    return min(int(round(self._fraction * n)), max(n - 1, 0))

  def num_examples(self, client_id: str) -> int:
    """The size of this side of `client_id`'s split, from its size alone."""
    n = num_examples(self._clients, client_id)
    return self._held(n) if self._held_out else n - self._held(n)

  def __getitem__(self, client_id: str) -> Examples:
    examples = self._clients[client_id]
    n = len(examples)
    held = self._held(n)
    order = np.random.default_rng(
        [self._seed, HOLDOUT_STREAM, self._index[client_id]]).permutation(n)
    chosen = order[:held] if self._held_out else order[held:]
    return examples.take(np.sort(chosen))

  def __iter__(self) -> Iterator[str]:
    return iter(self._clients)

  def __len__(self) -> int:
    return len(self._clients)

  def __contains__(self, client_id) -> bool:
    return client_id in self._clients


def with_holdout(data: FederatedData, fraction: float, seed: int) -> FederatedData:
  """`data` with a seeded `fraction` of each client's examples moved to its own test split.

  Client i's held-out examples are drawn from stream [seed, HOLDOUT_STREAM, i]:
  round(fraction * n) of its n examples, at most n - 1. Splits are computed
  when a client is read, so a lazily loaded population stays lazy. The
  pooled `test` set is unchanged.
  """
  return dataclasses.replace(data, clients=_HeldOut(data.clients, fraction, seed, False),
                             client_test=_HeldOut(data.clients, fraction, seed, True))
