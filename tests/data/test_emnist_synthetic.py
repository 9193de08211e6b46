"""`emnist_synthetic`: shapes, determinism, label skew, learnability."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.config.typed import parse
from fedsim.data import DATASETS
from fedsim.data.emnist_synthetic import EmnistSyntheticParams
from fedsim.errors import UserError


def build(seed: int = 0, **kwargs):
  return DATASETS.get("emnist_synthetic").build(EmnistSyntheticParams(**kwargs), seed)


def test_shapes_types_and_ranges():
  data = build(num_clients=3, examples_per_client=50, test_examples=70)
  assert data.client_ids == ("client_0000", "client_0001", "client_0002")
  assert data.input_shape == (28, 28, 1) and data.num_classes == 10
  assert len(data.test) == 70
  for part in [data.test, *data.clients.values()]:
    assert part.x.dtype == np.float32 and part.y.dtype == np.int32
    assert part.x.min() >= 0.0 and part.x.max() <= 1.0
    assert part.y.min() >= 0 and part.y.max() < 10
  assert [len(c) for c in data.clients.values()] == [50, 50, 50]


def test_defaults():
  params = EmnistSyntheticParams()
  assert (params.num_clients, params.examples_per_client, params.test_examples,
          params.batch_size) == (10, 200, 1000, 20)


def test_deterministic_in_the_seed_and_per_client():
  first, again, other = build(0, num_clients=3), build(0, num_clients=3), build(1, num_clients=3)
  more = build(0, num_clients=5)
  for cid in first.client_ids:
    np.testing.assert_array_equal(first.clients[cid].x, again.clients[cid].x)
    np.testing.assert_array_equal(first.clients[cid].x, more.clients[cid].x)
    assert not np.array_equal(first.clients[cid].x, other.clients[cid].x)
  np.testing.assert_array_equal(first.test.x, more.test.x)


def test_alpha_skews_client_labels():
  uniform = build(num_clients=20).describe()["labels_per_client"]
  skewed = build(num_clients=20, alpha=0.05).describe()["labels_per_client"]
  assert uniform["min"] == 10
  assert skewed["median"] <= 3


def test_nearest_class_mean_beats_chance_clearly_but_not_perfectly():
  data = build()
  x = np.concatenate([c.x for c in data.clients.values()]).reshape(-1, 28 * 28)
  y = np.concatenate([c.y for c in data.clients.values()])
  means = np.stack([x[y == k].mean(axis=0) for k in range(10)])
  test_x = data.test.x.reshape(-1, 28 * 28)
  distances = ((test_x[:, None, :] - means[None]) ** 2).sum(axis=-1)
  accuracy = (distances.argmin(axis=1) == data.test.y).mean()
  assert 0.7 < accuracy < 0.95  # measured 0.807; chance is 0.1


def test_config_section_parses_and_alpha_is_optional():
  params = parse(EmnistSyntheticParams, {"num_clients": 3, "alpha": 0.5}, "data")
  assert (params.num_clients, params.alpha, params.batch_size) == (3, 0.5, 20)
  assert parse(EmnistSyntheticParams, {"alpha": None}, "data").alpha is None
  with pytest.raises(UserError, match=r"^data.alpha: must be >= 1e-06, got 0.0$"):
    parse(EmnistSyntheticParams, {"alpha": 0}, "data")
