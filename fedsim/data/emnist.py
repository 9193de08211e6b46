"""`emnist`: Federated EMNIST (Caldas et al., LEAF 2018) from TFF's `emnist_all.sqlite`.

Each client is one writer. `only_digits: true` reads TFF's `digits_only_*`
splits (3,383 writers, labels 0-9), `false` the `all_*` splits (3,400
writers, 62 labels: 0-9 digits, 10-35 'A'-'Z', 36-61 'a'-'z'). As in TFF,
every writer's examples are split between train and test; the held-out set
is TFF's test split of all writers, centralized, and each writer's own test
examples are its test split for per-client evaluation (`eval.federated`).

Pixels are TFF's as given: float32 in [0, 1] with the background at 1.0 and
ink near 0 (TFF's own autoencoder task computes `1 - pixels`; fedsim's
`emnist_synthetic` draws ink as 1). `invert_pixels: true` gives ink = 1.
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

SIDE = 28
# TFF's parse spec for emnist_all.sqlite (tff.simulation.datasets.emnist).
FEATURES = {"pixels": ((SIDE, SIDE), "float32"), "label": ((), "int64")}


@dataclasses.dataclass(frozen=True)
class EmnistParams(tff_files.TffFileParams):
  only_digits: bool = True  # 10 digit classes; false: 62 classes (digits and letters)
  invert_pixels: bool = False  # true: ink 1, background 0
  batch_size: int = bounded(20, min=1)


def decode(records: Sequence[bytes], *, path: pathlib.Path, key: str,
           invert: bool) -> Examples:
  """x float32 [n, 28, 28, 1] in [0, 1], y int32 [n]."""
  parsed = tff_sqlite.parse(records, FEATURES, path=path, key=key)
  x = parsed["pixels"].astype(np.float32, copy=False).reshape(-1, SIDE, SIDE, 1)
  if invert:
    x = 1.0 - x
  return Examples(x, parsed["label"].astype(np.int32))


@DATASETS.register("emnist", params=EmnistParams)
def build(params: EmnistParams, seed: int, *, key: str = "data") -> FederatedData:
  """Federated EMNIST (TFF's file, offline): 28x28x1 handwriting, one client per writer."""
  prefix = "digits_only" if params.only_digits else "all"
  return tff_files.federated_from_file(
      "emnist", params, seed, splits=(f"{prefix}_train", f"{prefix}_test"),
      decode=functools.partial(decode, invert=params.invert_pixels),
      num_classes=10 if params.only_digits else 62, own_test=True, one_example_per_record=True,
      key=key)
