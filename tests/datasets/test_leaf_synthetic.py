from __future__ import annotations

import numpy as np

from fedsim.config.typed import parse
from fedsim.data import DATASETS
from fedsim.data import leaf_synthetic


def build(seed=0, **params):
  entry = DATASETS.get("synthetic")
  return entry.build(parse(entry.params, params, "data"), seed)


def test_shapes_and_held_out_share():
  data = build(num_clients=5)
  sizes = [leaf_synthetic.client_size(0, k) for k in range(5)]
  held = [int(round(0.2 * n)) for n in sizes]
  assert [len(c) for c in data.clients.values()] == [n - h for n, h in zip(sizes, held)]
  assert len(data.test) == sum(held)
  assert (data.input_shape, data.num_classes) == ((60,), 10)
  client = data.clients[data.client_ids[0]]
  assert client.x.dtype == np.float32 and client.y.dtype == np.int32
  assert client.y.min() >= 0 and client.y.max() < 10


def test_seeded_and_independent_of_population():
  a, b = build(seed=4, num_clients=3), build(seed=4, num_clients=6)
  for cid in a.client_ids:
    np.testing.assert_array_equal(a.clients[cid].x, b.clients[cid].x)
    np.testing.assert_array_equal(a.clients[cid].y, b.clients[cid].y)
  c = build(seed=5, num_clients=3)
  assert not np.array_equal(a.clients[a.client_ids[0]].x, c.clients[c.client_ids[0]].x)


def test_client_sizes_are_heavy_tailed():
  sizes = np.array([leaf_synthetic.client_size(0, k) for k in range(2000)])
  assert sizes.min() >= 50
  # log(size - 50) ~ N(4, 2^2): check its mean and spread, and the long tail.
  logs = np.log(sizes[sizes > 50] - 50)
  assert abs(logs.mean() - 4) < 0.15 and abs(logs.std() - 2) < 0.15
  assert np.mean(sizes) > 3 * np.median(sizes)


def _label_disparity(data):
  """Mean total-variation distance between each client's label histogram and the pooled one."""
  hists = np.stack([np.bincount(c.y, minlength=10) / len(c) for c in data.clients.values()])
  pooled = hists.mean(axis=0)
  return float(np.mean(0.5 * np.abs(hists - pooled).sum(axis=1)))


def _feature_mean_spread(data):
  return float(np.std([c.x.mean() for c in data.clients.values()]))


def test_beta_raises_heterogeneity():
  iid = build(num_clients=30, iid=True)
  none, some, more = (build(num_clients=30, beta=b) for b in (0.0, 1.0, 3.0))
  assert _label_disparity(iid) < 0.2 < 0.7 < _label_disparity(none)
  assert _label_disparity(none) < _label_disparity(some) < _label_disparity(more)
  assert 7 * _feature_mean_spread(none) < _feature_mean_spread(some)
  assert 2 * _feature_mean_spread(some) < _feature_mean_spread(more)


def test_alpha_cannot_change_labels():
  # u_k adds u_k * (sum(x) + 1) to every logit: the argmax, hence y, is the same.
  a, b = build(num_clients=5, alpha=0.0), build(num_clients=5, alpha=5.0)
  for cid in a.client_ids:
    np.testing.assert_array_equal(a.clients[cid].y, b.clients[cid].y)
