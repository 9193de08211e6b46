"""`custom`: a dataset built by the user's own function, named by import path.

This is the one place where a config imports code: `builder: "pkg.module:fn"`
is imported when the data is built (not when the config is validated) and
called as `fn(seed=<run seed>, **args)`. It returns one of

- a `fedsim.data.FederatedData` (used as is, apart from the
  `max_examples_per_client` cap);
- `{"clients": {client_id: (x, y), ...}, "test": (x, y)}`: federated data;
- `{"train": (x, y), "test": (x, y)}`: centralized data, which fedsim splits
  over `num_clients` clients with `partition` (`iid`, `dirichlet`, `shards`)
  like `digits`.

x is an array [n, *input_shape] (float32, or int32 token ids), y int [n] (or
[n, T] for sequences). `num_classes` defaults to the largest label + 1.

    data:
      name: custom
      builder: "mylab.datasets:load_sensors"   # importable from the working dir
      args: {window: 50}                        # passed on as keyword arguments
      partition: dirichlet
      alpha: 0.3
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from fedsim.config.typed import bounded
from fedsim.data import DATASETS
from fedsim.data.federated import (ClientBatching, Examples, FederatedData, Partitioning,
                                   federate, label_outside)
from fedsim.data.partition import partition
from fedsim.errors import UserError
from fedsim.registry import resolve
from fedsim.seeds import PARTITION_STREAM

_SHAPES = "a FederatedData or a dict with 'test' and either 'clients' or 'train'"


@dataclasses.dataclass(frozen=True)
class CustomParams(Partitioning, ClientBatching):
  builder: str = ""  # "package.module:function"
  # Clients to split centralized data over (required then); unused otherwise.
  num_clients: int | None = bounded(None, min=1)
  args: dict[str, Any] = dataclasses.field(default_factory=dict)  # keyword arguments
  num_classes: int | None = bounded(None, min=1)  # None: largest label + 1

  def check(self, key: str) -> None:
    module, _, name = self.builder.partition(":")
    if not module or not name:
      raise UserError(f"{key}.builder: expected 'package.module:function', got"
                      f" '{self.builder}'")


def _examples(pair: Any, what: str, key: str) -> Examples:
  try:
    x, y = pair
    return Examples(np.asarray(x), np.asarray(y))
  except (TypeError, ValueError) as e:
    raise UserError(f"{key}.builder: {what} must be an (x, y) pair of equal length ({e})"
                    ) from None


def _check_examples(parts: list[Examples], names: list[str], test: Examples,
                    num_classes: int | None, where: str) -> int:
  """Refuses what would otherwise fail deep inside TensorFlow; returns num_classes.

  Vectorized checks, one pass over each array: every client and the test set
  have examples, one feature shape, finite float features and integer labels
  in [0, num_classes) (num_classes: given, else the largest label + 1).

  Raises:
    UserError: `where` (the config key and builder), the part and the problem.
  """
  shape = None
  largest = -1
  for examples, name in zip([*parts, test], [*names, "the test set"]):
    x, y = examples.x, examples.y
    if len(y) == 0:
      raise UserError(f"{where}: {name} has no examples")
    if y.dtype.kind not in "iub":
      raise UserError(f"{where}: {name} has labels of type {y.dtype} (expected integer"
                      " class ids; map strings to 0..num_classes-1)")
    if x.dtype.kind not in "iufb":
      raise UserError(f"{where}: {name} has features of type {x.dtype} (expected numbers)")
    if shape is not None and x.shape[1:] != shape:
      raise UserError(f"{where}: {name} has features of shape {x.shape[1:]}, but"
                      f" {names[0]} has {shape}")
    shape = x.shape[1:]
    if x.dtype.kind == "f" and not np.isfinite(x).all():
      raise UserError(f"{where}: {name} has NaN or infinite features")
    high = int(y.max())
    if (bad := label_outside(y, num_classes)) is not None:
      raise UserError(f"{where}: {name} has label {bad}, outside"
                      f" 0..{(num_classes or high + 1) - 1}")
    largest = max(largest, high)
  return num_classes or largest + 1


@DATASETS.register("custom", params=CustomParams)
def build(params: CustomParams, seed: int, *, key: str = "data") -> FederatedData:
  """Your own dataset: `builder: "pkg.module:fn"` returning clients or centralized data."""
  made = resolve(params.builder, key=key)(seed=seed, **params.args)
  if isinstance(made, FederatedData):
    parts, test = [made.clients[c] for c in made.client_ids], made.test
    num_classes, ids = params.num_classes or made.num_classes, made.client_ids
  elif isinstance(made, Mapping) and "test" in made and ("clients" in made or "train" in made):
    test = _examples(made["test"], "'test'", key)
    if "clients" in made:
      ids = tuple(sorted(made["clients"]))
      parts = [_examples(made["clients"][c], f"client '{c}'", key) for c in ids]
    else:
      train = _examples(made["train"], "'train'", key)
      if params.num_clients is None:
        raise UserError(f"{key}.num_clients: required when {params.builder} returns"
                        " centralized 'train' data")
      # Before partitioning, which would choke on string labels.
      _check_examples([train], ["'train'"], test, params.num_classes,
                      f"{key}.builder: {params.builder}")
      index = partition(train.y, params, np.random.default_rng([seed, PARTITION_STREAM]),
                        key=key, dataset=params.builder)
      parts, ids = [train.take(i) for i in index], None
    if not parts:
      raise UserError(f"{key}.builder: {params.builder} returned no clients")
    num_classes = params.num_classes
  else:
    raise UserError(f"{key}.builder: {params.builder} returned {type(made).__name__};"
                    f" expected {_SHAPES}")
  names = [f"client '{c}'" for c in ids] if ids else [f"client {i}" for i in range(len(parts))]
  num_classes = _check_examples(parts, names, test, num_classes,
                                f"{key}.builder: {params.builder}")
  data = federate(parts, test, num_classes=num_classes,
                  max_examples_per_client=params.max_examples_per_client, seed=seed)
  if ids is None:
    return data
  return FederatedData(dict(zip(ids, data.clients.values())), data.test, data.input_shape,
                       data.num_classes)
