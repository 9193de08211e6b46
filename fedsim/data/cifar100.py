"""`cifar100`: federated CIFAR-100 from TFF's `cifar100.sqlite`.

TFF's split (Reddi et al. 2021, "Adaptive Federated Optimization") deals the
50,000 training images to 500 clients of 100 images each with a two-level
(Pachinko) Dirichlet allocation over coarse then fine labels; the 10,000 test
images form the held-out set, centralized. x is float32 [n, 32, 32, 3] in
[0, 1] (TFF stores uint8 pixels 0-255); y is the fine label (100 classes) or,
with `coarse_labels: true`, the superclass (20 classes).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Sequence

import numpy as np

from fedsim.config.typed import bounded
from fedsim.data import DATASETS
from fedsim.data import tff_files, tff_sqlite
from fedsim.data.federated import Examples, FederatedData

SIDE = 32
# TFF's parse spec for cifar100.sqlite (tff.simulation.datasets.cifar100).
FEATURES = {"image": ((SIDE, SIDE, 3), "int64"), "label": ((), "int64"),
            "coarse_label": ((), "int64")}


@dataclasses.dataclass(frozen=True)
class Cifar100Params(tff_files.TffFileParams):
  coarse_labels: bool = False  # true: the 20 superclasses instead of 100 classes
  batch_size: int = bounded(20, min=1)


def decode(records: Sequence[bytes], *, path: pathlib.Path, key: str,
           coarse: bool) -> Examples:
  """x float32 [n, 32, 32, 3] in [0, 1], y int32 [n]."""
  parsed = tff_sqlite.parse(records, FEATURES, path=path, key=key)
  x = parsed["image"].astype(np.float32) / 255.0
  return Examples(x, parsed["coarse_label" if coarse else "label"].astype(np.int32))


@DATASETS.register("cifar100", params=Cifar100Params)
def build(params: Cifar100Params, seed: int, *, key: str = "data") -> FederatedData:
  """CIFAR-100 (TFF's file, offline): 32x32 colour images, 500 clients x 100."""
  return tff_files.federated_from_file(
      "cifar100", params, seed, splits=("train", "test"),
      decode=functools.partial(decode, coarse=params.coarse_labels),
      num_classes=20 if params.coarse_labels else 100, one_example_per_record=True,
      key=key)
