"""`digits`: scikit-learn's bundled handwritten digits, split over clients.

1,797 real 8x8 grey images of the digits 0-9 (the UCI optdigits test set),
shipped inside scikit-learn, so no download is needed. Pixel counts 0..16 are
scaled to [0, 1] and flattened to 64 features.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import importlib.util
import math
import pathlib

import numpy as np

from fedsim.config.typed import bounded
from fedsim.data import DATASETS
from fedsim.data.federated import (ClientBatching, Examples, FederatedData, Partitioning,
                                   federate)
from fedsim.data.partition import partition
from fedsim.seeds import PARTITION_STREAM, SPLIT_STREAM

NUM_CLASSES = 10


@dataclasses.dataclass(frozen=True)
class DigitsParams(Partitioning, ClientBatching):
  test_fraction: float = bounded(0.2, gt=0, max=0.9)  # share of the 1,797 images held out


@functools.lru_cache(maxsize=1)
def load_all() -> Examples:
  """All 1,797 images: x float32 [1797, 64] in [0, 1], y int32 [1797]."""
  table = _digits_table()
  x = (table[:, :-1] / 16.0).astype(np.float32)
  y = table[:, -1].astype(np.int32)
  x.flags.writeable = y.flags.writeable = False  # cached: shared by every caller
  return Examples(x, y)


def _digits_table() -> np.ndarray:
  """scikit-learn's digits file: float64 [1797, 65], 64 pixel counts then the label.

  Read as `sklearn.datasets.load_digits` reads it, without importing
  scikit-learn: that import (SciPy's stats and more) costs ~1.5 s of start-up.
  """
  spec = importlib.util.find_spec("sklearn")
  path = pathlib.Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if (
      spec and spec.origin) else None
  if path is None or not path.is_file():  # another layout: ask scikit-learn
    from sklearn import datasets
    bunch = datasets.load_digits()
    return np.column_stack([bunch.data, bunch.target])
  with gzip.open(path, "rt", encoding="utf-8") as rows:
    return np.loadtxt(rows, delimiter=",")


def stratified_split(labels: np.ndarray, test_fraction: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """Sorted (train, test) index arrays with label proportions kept in both parts.

  The test part has ceil(test_fraction * n) examples; each label gets its
  proportional share, rounded by largest remainder (ties to the smaller label).
  """
  classes, counts = np.unique(labels, return_counts=True)
  total = math.ceil(test_fraction * len(labels))
  quota = counts * total / len(labels)
  take = np.floor(quota).astype(int)
  remainder_order = np.argsort(-(quota - take), kind="stable")
  take[remainder_order[:total - take.sum()]] += 1
  test = np.concatenate([rng.permutation(np.flatnonzero(labels == k))[:t]
                         for k, t in zip(classes, take)])
  in_test = np.zeros(len(labels), bool)
  in_test[test] = True
  return np.flatnonzero(~in_test), np.flatnonzero(in_test)


@DATASETS.register("digits", params=DigitsParams, traits={"quick": True})
def build(params: DigitsParams, seed: int, *, key: str = "data") -> FederatedData:
  """Real 8x8 handwritten digits (sklearn), partitioned over clients."""
  everything = load_all()
  train_idx, test_idx = stratified_split(
      everything.y, params.test_fraction, np.random.default_rng([seed, SPLIT_STREAM]))
  train = everything.take(train_idx)
  parts = partition(train.y, params, np.random.default_rng([seed, PARTITION_STREAM]),
                    key=key, dataset="digits")
  return federate([train.take(p) for p in parts], everything.take(test_idx),
                  num_classes=NUM_CLASSES,
                  max_examples_per_client=params.max_examples_per_client, seed=seed)
