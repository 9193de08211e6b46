"""FederatedData, Examples, client ids, and the dataset registry."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fedsim.data import DATASETS
from fedsim.data.federated import Examples, FederatedData, client_ids
from fedsim.errors import UserError
from tests.registries import builtin_names


def examples(labels: list[int]) -> Examples:
  return Examples(np.zeros((len(labels), 2), np.float32), np.array(labels, np.int32))


def test_describe_reports_sizes_and_label_counts():
  clients = {f"c{i}": examples(list(range(i + 1)) * 2) for i in range(5)}  # sizes 2,4,...,10
  data = FederatedData(clients, examples([0, 1, 2]), (2,), 10)
  summary = data.describe()
  assert summary["num_clients"] == 5 and summary["total_examples"] == 30
  assert summary["test_examples"] == 3 and summary["input_shape"] == [2]
  assert summary["examples_per_client"] == {"min": 2.0, "p10": 2.8, "median": 6.0,
                                            "p90": 9.2, "max": 10.0}
  assert summary["labels_per_client"]["median"] == 3.0


def test_capped_keeps_order_and_only_binds_above_the_cap():
  ex = Examples(np.arange(10, dtype=np.float32)[:, None], np.arange(10, dtype=np.int32))
  capped = ex.capped(4, np.random.default_rng(0))
  assert len(capped) == 4 and list(capped.y) == sorted(capped.y)
  np.testing.assert_array_equal(capped.x[:, 0], capped.y)
  assert ex.capped(10, np.random.default_rng(0)) is ex
  assert ex.capped(None, np.random.default_rng(0)) is ex


def test_examples_reject_mismatched_lengths():
  with pytest.raises(ValueError):
    Examples(np.zeros((3, 2), np.float32), np.zeros(2, np.int32))


def test_client_ids_sort_numerically():
  assert client_ids(2) == ["client_0000", "client_0001"]
  ids = client_ids(12000)
  assert ids[-1] == "client_11999" and ids == sorted(ids)


def test_registry_names_and_did_you_mean():
  assert builtin_names(DATASETS) == ["cifar100", "custom", "digits", "emnist", "emnist_synthetic",
                             "shakespeare", "stackoverflow", "synthetic"]
  with pytest.raises(UserError, match=r"^data.name: unknown dataset 'digit' \(did you mean"
                     r" 'digits'\?\)"):
    DATASETS.get("digit", "data.name")


def test_importing_the_data_layer_loads_neither_tensorflow_nor_sklearn():
  code = ("import sys, fedsim.data; "
          "print(sorted(m for m in ('tensorflow', 'sklearn') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
