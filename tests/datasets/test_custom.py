from __future__ import annotations

import numpy as np
import pytest

from fedsim.config.typed import parse
from fedsim.data import DATASETS
from fedsim.errors import UserError

MODULE = "tests.datasets.custom_builders"


def build(seed=0, **params):
  entry = DATASETS.get("custom")
  return entry.build(parse(entry.params, params, "data"), seed)


def test_centralized_data_is_partitioned():
  data = build(builder=f"{MODULE}:centralized", args={"n": 30}, num_clients=3,
               partition="shards", shards_per_client=1)
  assert data.client_ids == ("client_0000", "client_0001", "client_0002")
  assert [len(np.unique(c.y)) for c in data.clients.values()] == [1, 1, 1]
  assert (data.num_classes, data.input_shape, len(data.test)) == (3, (4,), 9)


def test_per_client_data_keeps_ids_and_caps():
  data = build(builder=f"{MODULE}:per_client", args={"clients": 3},
               max_examples_per_client=3)
  assert data.client_ids == ("user0", "user1", "user2")
  assert [len(c) for c in data.clients.values()] == [2, 3, 3]
  assert data.num_classes == 3


@pytest.mark.parametrize("builder, message", [
    ("nosuch_module_x:f", "data.builder: cannot import module 'nosuch_module_x'"),
    (f"{MODULE}:missing", f"data.builder: module '{MODULE}' has no function 'missing'"),
    (f"{MODULE}:wrong", f"data.builder: {MODULE}:wrong returned list; expected"),
])
def test_bad_builder_names_the_key(builder, message):
  with pytest.raises(UserError, match=message):
    build(builder=builder)


def test_builder_must_be_module_colon_function():
  with pytest.raises(UserError, match="data.builder: expected 'package.module:function', got"
                     " 'justname'"):
    build(builder="justname")


def test_centralized_needs_num_clients():
  with pytest.raises(UserError, match="data.num_clients: required"):
    build(builder=f"{MODULE}:centralized")
