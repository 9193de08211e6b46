"""Client populations built on access: a client's examples are loaded or
generated when it is read and kept in a small LRU cache, capped exactly as
`federated.federate` caps an eager population."""

from __future__ import annotations

import collections
import threading
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from fedsim.data.federated import Examples, cap_indices, client_ids, client_number
from fedsim.seeds import CAP_STREAM


class LazyClients(Mapping[str, Examples]):
  """Client id -> `Examples`, loaded on first access and kept in a small LRU cache.

  For populations too large to hold at once (EMNIST's 3,400 writers, a
  generated population of 100,000): peak memory follows `cache_size`, not
  the number of clients. Client i (in id order) is capped exactly as
  `federate` caps it, so a lazily loaded dataset gives the same examples as
  an eager one.
  """

  def __init__(self, ids: Sequence[str], load: Callable[[str], Examples], *,
               max_examples_per_client: int | None, seed: int, cache_size: int = 64,
               size: Callable[[str], int] | None = None,
               labels: Callable[[str], np.ndarray] | None = None):
    """`load(client_id)` returns that client's examples, uncapped.

    `size(client_id)` and `labels(client_id)`, when given, return the number
    and the labels of those uncapped examples without loading the features
    (for `num_examples` and `labels` here, which apply the cap).
    """
    self._index = {cid: i for i, cid in enumerate(ids)}
    self._load, self._cap, self._seed = load, max_examples_per_client, seed
    self._size, self._labels = size, labels
    self._cache: collections.OrderedDict[str, Examples] = collections.OrderedDict()
    self._cache_size = cache_size
    self._lock = threading.Lock()

  def _cap_rng(self, client_id: str) -> np.random.Generator:
    # KeyError for an unknown id, as a dict would raise.
    return np.random.default_rng([self._seed, CAP_STREAM, self._index[client_id]])

  def __getitem__(self, client_id: str) -> Examples:
    with self._lock:
      if client_id in self._cache:
        self._cache.move_to_end(client_id)
        return self._cache[client_id]
    rng = self._cap_rng(client_id)
    examples = self._load(client_id).capped(self._cap, rng)
    with self._lock:
      self._cache[client_id] = examples
      while len(self._cache) > self._cache_size:
        self._cache.popitem(last=False)
    return examples

  def cache_clear(self) -> None:
    """Forgets every cached client (a benchmark's cold start)."""
    with self._lock:
      self._cache.clear()

  def num_examples(self, client_id: str) -> int:
    """`len(self[client_id])`, without loading it when sizes are known."""
    if self._size is None:
      return len(self[client_id])
    if client_id not in self._index:  # as a dict would; without building its cap's RNG
      raise KeyError(client_id)
    n = self._size(client_id)
    return n if self._cap is None else min(n, self._cap)

  @property
  def labels(self) -> Callable[[str], np.ndarray] | None:
    """`client_id -> self[client_id].y` without loading features, or None when unknown."""
    if self._labels is None:
      return None

    def labels(client_id: str) -> np.ndarray:
      rng = self._cap_rng(client_id)
      y = self._labels(client_id)
      kept = cap_indices(len(y), self._cap, rng)
      return y if kept is None else y[kept]

    return labels

  def __iter__(self) -> Iterator[str]:
    return iter(self._index)

  def __len__(self) -> int:
    return len(self._index)

  def __contains__(self, client_id) -> bool:
    return client_id in self._index


def generated_clients(num_clients: int, generate: Callable[[int], Examples], *,
                      size: Callable[[int], int],
                      labels: Callable[[int], np.ndarray] | None = None,
                      max_examples_per_client: int | None, seed: int) -> LazyClients:
  """Clients "client_0000", ... of a generator whose client i depends only on (seed, i).

  Built on access (see `LazyClients`), so a population of 100,000 costs the
  driver no more memory than one of 1,000, and capped as `federate` caps.

  Args:
    num_clients: population size.
    generate: i -> client i's examples, uncapped.
    size: i -> len(generate(i)), cheaply.
    labels: i -> generate(i).y without the features, or None.
    max_examples_per_client: cap, or None.
    seed: the run seed (for the cap's stream).
  """
  # LazyClients has checked that an id is one of `client_ids(num_clients)`.
  return LazyClients(
      client_ids(num_clients), lambda cid: generate(client_number(cid)),
      max_examples_per_client=max_examples_per_client, seed=seed,
      size=lambda cid: size(client_number(cid)),
      labels=None if labels is None else (lambda cid: labels(client_number(cid))))
