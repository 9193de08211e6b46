"""Partitioners: coverage, determinism, skew, feasibility errors."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.data.federated import Partitioning
from fedsim.data.partition import PARTITIONERS, partition
from fedsim.errors import UserError
from tests.registries import builtin_names

# 10 labels x 100 examples, in a fixed shuffled order.
LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 100))


def split(seed: int = 0, labels: np.ndarray = LABELS, **kwargs) -> list[np.ndarray]:
  return partition(labels, Partitioning(**kwargs), np.random.default_rng(seed))


def distinct_labels(parts: list[np.ndarray]) -> np.ndarray:
  return np.array([len(np.unique(LABELS[p])) for p in parts])


def test_registry_holds_the_three_partitioners():
  assert builtin_names(PARTITIONERS) == ["dirichlet", "iid", "shards"]


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards"])
def test_parts_are_disjoint_sorted_and_cover_the_train_set(kind):
  parts = split(partition=kind, num_clients=25)
  assert len(parts) == 25
  assert all(np.array_equal(p, np.sort(p)) for p in parts)
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards"])
def test_same_seed_same_partition_other_seed_differs(kind):
  first, again, other = (split(s, partition=kind, num_clients=10) for s in (3, 3, 4))
  assert all(np.array_equal(a, b) for a, b in zip(first, again))
  assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_iid_sizes_differ_by_at_most_one():
  sizes = [len(p) for p in split(num_clients=7)]
  assert sorted(sizes) == [142] * 1 + [143] * 6  # 1000 = 6 x 143 + 142


@pytest.mark.parametrize("seed", range(5))
def test_dirichlet_small_alpha_gives_far_fewer_labels_per_client(seed):
  skewed = distinct_labels(split(seed, partition="dirichlet", alpha=0.05, num_clients=10))
  flat = distinct_labels(split(seed, partition="dirichlet", alpha=100.0, num_clients=10))
  assert skewed.mean() < 5  # measured 2.8-4.2 over seeds 0-19
  assert flat.min() == 10


def test_dirichlet_honours_min_examples_per_client():
  parts = split(partition="dirichlet", alpha=0.3, num_clients=20, min_examples_per_client=30)
  assert min(len(p) for p in parts) >= 30


def test_shards_on_label_aligned_shards_give_whole_shards_of_one_label():
  # 50 shards of 20 examples; every label fills exactly 5 shards, none straddles.
  parts = split(partition="shards", num_clients=25, shards_per_client=2)
  for p in parts:
    labels, counts = np.unique(LABELS[p], return_counts=True)
    assert len(p) == 40
    assert len(labels) <= 2
    assert set(counts) <= {20, 40}


def test_shards_labels_bounded_by_shard_boundaries():
  # 1000 examples in 60 shards of 16-17: shards straddle label boundaries.
  parts = split(partition="shards", num_clients=20, shards_per_client=3)
  labels = distinct_labels(parts)
  assert labels.max() <= 2 * 3
  # Each shard holds one label plus one more per label boundary inside it,
  # and the sorted order has 9 boundaries.
  assert labels.sum() <= 20 * 3 + 9
  assert {len(p) for p in parts} <= {48, 49, 50, 51}  # 3 shards of 16 or 17


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_clients=1001),
     "data.num_clients: 1001 clients need at least 1001 examples, the dataset has 1000"
     " for training"),
    (dict(num_clients=100, min_examples_per_client=11),
     "data.min_examples_per_client: 100 clients x 11 examples need 1100, the dataset has"
     " 1000 for training"),
    (dict(partition="dirichlet", alpha=0.001, num_clients=100),
     "data.alpha: 0.001 left some of 100 clients with fewer than 1 examples"),
    (dict(partition="shards", num_clients=300, shards_per_client=4),
     "data.shards_per_client: 300 clients x 4 shards need at least 1200 examples, got 1000"),
    (dict(partition="shards", num_clients=100, shards_per_client=3, min_examples_per_client=10),
     "data.min_examples_per_client: shards of 3 examples leave a client with as few as 9,"
     " below 10"),
])
def test_impossible_requests_name_the_key(kwargs, message):
  with pytest.raises(UserError) as error:
    split(**kwargs)
  assert str(error.value).startswith(message)


def test_unknown_partitioner_names_the_key():
  with pytest.raises(UserError, match=r"^data.partition: unknown partition 'iidd'"):
    split(partition="iidd")
