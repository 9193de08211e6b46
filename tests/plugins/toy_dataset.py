"""A dataset plugin, one file: Gaussian blobs, one per class, split over clients.

Named in a config as `data: {name: blobs, num_clients: 6, dim: 5}` after
`plugins: [toy_dataset.py]`; it registers the way fedsim's own datasets do.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedsim.config.typed import bounded
from fedsim.data import DATASETS
from fedsim.data.federated import ClientBatching, Examples, FederatedData, Partitioning, federate
from fedsim.data.partition import partition


@dataclasses.dataclass(frozen=True)
class BlobsParams(Partitioning, ClientBatching):
  dim: int = bounded(5, min=1)             # features per example
  classes: int = bounded(3, min=2)
  examples: int = bounded(300, min=10)     # training examples in all
  spread: float = bounded(1.0, gt=0)       # each blob's standard deviation


@DATASETS.register("blobs", params=BlobsParams)
def build_blobs(params: BlobsParams, seed: int, *, key: str = "data") -> FederatedData:
  """Gaussian blobs around random class centres (a plugin's dataset)."""
  rng = np.random.default_rng([seed, 1234])
  centres = rng.normal(scale=3.0, size=(params.classes, params.dim))

  def draw(n):
    y = rng.integers(0, params.classes, n)
    x = centres[y] + rng.normal(scale=params.spread, size=(n, params.dim))
    return Examples(x.astype(np.float32), y.astype(np.int64))

  train, test = draw(params.examples), draw(params.examples // 3)
  parts = partition(train.y, params, rng, key=key, dataset="blobs")
  return federate([train.take(p) for p in parts], test, num_classes=params.classes,
                  max_examples_per_client=params.max_examples_per_client, seed=seed)
