"""`digits`: sklearn's 1,797 real images, split, partitioned, configured."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.config.typed import parse
from fedsim.data import DATASETS
from fedsim.data.digits import DigitsParams, load_all, stratified_split
from fedsim.errors import UserError


def build(seed: int = 0, **kwargs):
  return DATASETS.get("digits").build(DigitsParams(**kwargs), seed)


@pytest.mark.parametrize("fraction, test_size", [(0.2, 360), (0.5, 899), (0.9, 1618)])
def test_all_1797_images_split_into_train_and_test(fraction, test_size):
  data = build(test_fraction=fraction, num_clients=10)
  assert len(data.test) == test_size
  assert sum(len(c) for c in data.clients.values()) == 1797 - test_size


def test_features_are_64_floats_in_unit_range_and_labels_ten_classes():
  data = build()
  assert data.input_shape == (64,) and data.num_classes == 10
  for part in [data.test, *data.clients.values()]:
    assert part.x.dtype == np.float32 and part.x.shape[1:] == (64,)
    assert part.y.dtype == np.int32
  everything = load_all()
  assert everything.x.min() == 0.0 and everything.x.max() == 1.0
  assert sorted(np.unique(everything.y)) == list(range(10))


def test_split_is_stratified_disjoint_and_seeded():
  labels = load_all().y
  train, test = stratified_split(labels, 0.2, np.random.default_rng(0))
  assert len(np.intersect1d(train, test)) == 0 and len(train) + len(test) == 1797
  share = np.bincount(labels[test], minlength=10) / np.bincount(labels, minlength=10)
  assert np.abs(share - 0.2).max() < 0.01  # classes have 174-183 images
  again, _ = stratified_split(labels, 0.2, np.random.default_rng(0))
  other, _ = stratified_split(labels, 0.2, np.random.default_rng(1))
  np.testing.assert_array_equal(train, again)
  assert not np.array_equal(train, other)


def test_same_seed_same_data_other_seed_different():
  first, again, other = build(0), build(0), build(1)
  assert first.client_ids == again.client_ids == tuple(f"client_{i:04d}" for i in range(40))
  assert all(np.array_equal(first.clients[c].x, again.clients[c].x) for c in first.client_ids)
  assert not np.array_equal(first.test.y, other.test.y)


def test_max_examples_per_client_caps_each_client():
  sizes = [len(c) for c in build(num_clients=10, max_examples_per_client=100).clients.values()]
  assert sizes == [100] * 10  # iid parts hold 143-144 examples


def test_too_many_clients_names_the_key():
  with pytest.raises(UserError) as error:
    build(num_clients=5000)
  assert str(error.value) == ("data.num_clients: 5000 clients need at least 5000 examples,"
                              " digits has 1437 for training")


def test_config_section_parses_and_bounds_name_the_key():
  params = parse(DigitsParams, {"num_clients": 5, "partition": "dirichlet", "alpha": 0.1,
                                "batch_size": 8}, "data")
  assert (params.num_clients, params.partition, params.batch_size, params.epochs) == (
      5, "dirichlet", 8, 1)
  with pytest.raises(UserError, match=r"^data.test_fraction: must be <= 0.9, got 0.95$"):
    parse(DigitsParams, {"test_fraction": 0.95}, "data")
  with pytest.raises(UserError, match=r"^data.partition: unknown partition 'shard' \(did you"
                                      r" mean 'shards'\?\); choose one of: dirichlet, iid"):
    parse(DigitsParams, {"partition": "shard"}, "data")


def test_the_images_are_scikit_learns_load_digits_scaled_to_unit_range():
  from sklearn.datasets import load_digits
  bunch = load_digits()
  everything = load_all()
  np.testing.assert_array_equal(everything.x, (bunch.data / 16.0).astype(np.float32))
  np.testing.assert_array_equal(everything.y, bunch.target)


def test_without_the_file_where_expected_scikit_learn_loads_the_same_table(monkeypatch):
  from fedsim.data import digits
  table = digits._digits_table()  # pylint: disable=protected-access
  monkeypatch.setattr(digits.importlib.util, "find_spec", lambda name: None)
  np.testing.assert_array_equal(digits._digits_table(), table)  # pylint: disable=protected-access
  assert table.shape == (1797, 65)
