"""Generated datasets build clients on demand and equal the eager build, example for example."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.config.typed import parse
from fedsim.data import DATASETS, emnist_synthetic, leaf_synthetic
from fedsim.data.describe import summary
from fedsim.data.federated import (DESCRIBE_CLIENTS, Examples, FederatedData, federate,
                                   num_examples, with_holdout)
from fedsim.data.lazy_clients import LazyClients
from fedsim.seeds import GENERATE_STREAM


def build(name, seed=0, **params):
  entry = DATASETS.get(name)
  return entry.build(parse(entry.params, params, "data"), seed)


def emnist_eager(seed, num_clients, examples, cap=None, alpha=None):
  """Every client built up front from its own stream, as documented: labels, then pixels."""
  parts = []
  for i in range(num_clients):
    rng = np.random.default_rng([seed, GENERATE_STREAM, 0, i])
    labels = (rng.integers(0, 10, examples) if alpha is None else
              rng.choice(10, examples, p=rng.dirichlet(np.full(10, alpha))))
    parts.append(emnist_synthetic.generate(labels, rng))
  test = Examples(np.zeros((1, 28, 28, 1), np.float32), np.zeros(1, np.int32))
  return federate(parts, test, num_classes=10, max_examples_per_client=cap, seed=seed)


def assert_same_clients(lazy: FederatedData, eager: FederatedData):
  assert lazy.client_ids == eager.client_ids
  for cid in eager.client_ids:
    np.testing.assert_array_equal(lazy.clients[cid].x, eager.clients[cid].x)
    np.testing.assert_array_equal(lazy.clients[cid].y, eager.clients[cid].y)
    assert lazy.client_size(cid) == len(eager.clients[cid])
    assert lazy.clients.labels(cid).tolist() == eager.clients[cid].y.tolist()


@pytest.mark.parametrize("cap,alpha", [(None, None), (30, None), (None, 0.3), (30, 0.3)])
def test_emnist_synthetic_on_demand_equals_the_eager_build(cap, alpha):
  lazy = build("emnist_synthetic", 3, num_clients=4, examples_per_client=50, test_examples=5,
               max_examples_per_client=cap, alpha=alpha)
  assert isinstance(lazy.clients, LazyClients)
  assert_same_clients(lazy, emnist_eager(3, 4, 50, cap, alpha))


def test_leaf_synthetic_on_demand_equals_the_eager_build():
  params = parse(leaf_synthetic.SyntheticParams,
                 {"num_clients": 4, "max_examples_per_client": 80}, "data")
  lazy = DATASETS.get("synthetic").build(params, 2)
  train, held = [], []
  for k in range(4):
    whole = leaf_synthetic.generate_client(params, 2, k)
    cut = len(whole) - int(round(0.2 * len(whole)))
    train.append(whole.take(np.arange(cut)))
    held.append(whole.take(np.arange(cut, len(whole))))
  eager = federate(train, held[0], num_classes=10, max_examples_per_client=80, seed=2)
  for cid, own in zip(eager.client_ids, held):
    np.testing.assert_array_equal(lazy.clients[cid].x, eager.clients[cid].x)
    np.testing.assert_array_equal(lazy.clients[cid].y, eager.clients[cid].y)
    assert lazy.client_size(cid) == len(eager.clients[cid])
    np.testing.assert_array_equal(lazy.client_test[cid].x, own.x)
  np.testing.assert_array_equal(lazy.test.y, np.concatenate([h.y for h in held]))


def test_a_large_population_is_built_without_generating_its_clients():
  data = build("emnist_synthetic", num_clients=100_000, examples_per_client=20,
               test_examples=5, max_examples_per_client=15)
  assert len(data.client_ids) == 100_000 and data.client_ids[-1] == "client_99999"
  assert data.client_size("client_99999") == 15
  assert data.clients._cache == {}  # nothing generated yet
  one = data.clients["client_54321"]
  assert len(one) == 15 and len(data.clients._cache) == 1
  with pytest.raises(KeyError):
    data.client_size("client_100000")


def test_describe_counts_labels_without_features_and_says_when_it_samples():
  data = build("emnist_synthetic", num_clients=2000, examples_per_client=4, test_examples=5)
  stats = data.describe()
  assert data.clients._cache == {}  # sizes and labels came without pixels
  assert stats["total_examples"] == 8000 and stats["labels_sampled_clients"] is None
  want = [len(np.unique(data.clients.labels(c))) for c in data.client_ids]
  assert stats["labels_per_client"]["median"] == np.median(want)
  # Held-out splits know their sizes, but not their labels: a sample is read.
  split = with_holdout(data, 0.5, seed=0)
  assert num_examples(split.clients, "client_0007") == 2
  stats = split.describe()
  assert stats["total_examples"] == 4000 and stats["labels_sampled_clients"] == DESCRIBE_CLIENTS
  assert "(a seeded sample of 1000 clients)" in summary("x", split, seed=0)
  assert "sample" not in summary("x", data, seed=0)
