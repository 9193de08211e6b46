"""Splitting a centralized training set over clients, by name.

Each partitioner is `fn(labels, params, rng, key=...) -> list[np.ndarray]`:
one sorted array of example indices per client, disjoint, together covering
every example. `params` is the dataset section's `Partitioning`; `key` is
the config path of the dataset section, used in error messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedsim.errors import UserError
from fedsim.registry import Registry

if TYPE_CHECKING:  # fedsim.data.federated imports this module for PARTITIONERS
  from fedsim.data.federated import Partitioning

PARTITIONERS = Registry("partition")

# Rejection sampling for `dirichlet`: each draw costs well under a millisecond,
# and when this many all fail the request is practically infeasible.
MAX_DIRICHLET_DRAWS = 1000


def partition(labels: np.ndarray, params: Partitioning, rng: np.random.Generator, *,
              key: str = "data", dataset: str = "the dataset") -> list[np.ndarray]:
  """Splits examples with labels `labels` over `params.num_clients` clients.

  Returns:
    One sorted int array of indices into `labels` per client.

  Raises:
    UserError: naming `{key}.<field>` when the request cannot be met, e.g.
      more clients than examples.
  """
  n, clients, least = len(labels), params.num_clients, params.min_examples_per_client
  if clients > n:
    raise UserError(f"{key}.num_clients: {clients} clients need at least {clients} examples,"
                    f" {dataset} has {n} for training")
  if clients * least > n:
    raise UserError(f"{key}.min_examples_per_client: {clients} clients x {least} examples"
                    f" need {clients * least}, {dataset} has {n} for training")
  build = PARTITIONERS.get(params.partition, f"{key}.partition").build
  return build(np.asarray(labels), params, rng, key=key)


@PARTITIONERS.register("iid")
def iid(labels: np.ndarray, params: Partitioning, rng: np.random.Generator, *,
        key: str = "data") -> list[np.ndarray]:
  """Uniformly shuffled split into near-equal parts (sizes differ by at most one)."""
  del key  # `partition` has checked everything iid needs
  parts = np.array_split(rng.permutation(len(labels)), params.num_clients)
  return [np.sort(p) for p in parts]


@PARTITIONERS.register("dirichlet")
def dirichlet(labels: np.ndarray, params: Partitioning, rng: np.random.Generator, *,
              key: str = "data") -> list[np.ndarray]:
  """Label skew: each label's examples split over clients by Dirichlet(alpha) shares.

  Small alpha gives each client few labels; large alpha approaches iid. The
  whole split is redrawn until every client has `min_examples_per_client`.

  Raises:
    UserError: naming `{key}.alpha` after MAX_DIRICHLET_DRAWS failed draws.
  """
  clients, least = params.num_clients, params.min_examples_per_client
  by_label = [rng.permutation(np.flatnonzero(labels == k)) for k in np.unique(labels)]
  concentration = np.full(clients, params.alpha)
  for _ in range(MAX_DIRICHLET_DRAWS):
    # counts[k, c]: examples of label k that client c gets.
    counts = np.stack([_shares_to_counts(rng.dirichlet(concentration), len(idx))
                       for idx in by_label])
    if counts.sum(axis=0).min() >= least:
      break
  else:
    raise UserError(
        f"{key}.alpha: {params.alpha} left some of {clients} clients with fewer than"
        f" {least} examples ({key}.min_examples_per_client) in {MAX_DIRICHLET_DRAWS}"
        f" draws; raise {key}.alpha or lower {key}.num_clients")
  pieces = [np.split(idx, np.cumsum(row)[:-1]) for idx, row in zip(by_label, counts)]
  return [np.sort(np.concatenate([p[c] for p in pieces])) for c in range(clients)]


def _shares_to_counts(shares: np.ndarray, total: int) -> np.ndarray:
  """Integer counts summing to `total`, proportional to `shares` (floors of the cumsum)."""
  edges = np.floor(np.cumsum(shares) * total).astype(int)
  edges[-1] = total  # the cumsum of float shares may end a hair below 1
  return np.diff(edges, prepend=0)


@PARTITIONERS.register("shards")
def shards(labels: np.ndarray, params: Partitioning, rng: np.random.Generator, *,
           key: str = "data") -> list[np.ndarray]:
  """Pathological non-iid split of McMahan et al. (2017).

  Sorts examples by label, cuts them into num_clients * shards_per_client
  contiguous shards of near-equal size and deals each client
  shards_per_client random shards. A shard spans more than one label only
  where it straddles a label boundary.

  Raises:
    UserError: naming `{key}.shards_per_client` when there are fewer examples
      than shards, or `{key}.min_examples_per_client` when the smallest
      possible client would fall below it.
  """
  n, clients, per_client = len(labels), params.num_clients, params.shards_per_client
  count = clients * per_client
  if count > n:
    raise UserError(f"{key}.shards_per_client: {clients} clients x {per_client} shards need"
                    f" at least {count} examples, got {n}")
  smallest = per_client * (n // count)
  if smallest < params.min_examples_per_client:
    raise UserError(f"{key}.min_examples_per_client: shards of {n // count} examples leave a"
                    f" client with as few as {smallest}, below {params.min_examples_per_client}")
  # Shuffle first so that which examples of a label share a shard is random too.
  shuffled = rng.permutation(n)
  by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
  cut = np.array_split(by_label, count)
  dealt = rng.permutation(count).reshape(clients, per_client)
  return [np.sort(np.concatenate([cut[s] for s in row])) for row in dealt]
