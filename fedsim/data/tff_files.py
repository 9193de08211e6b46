"""TFF's published federated datasets as `FederatedData`: a seeded choice of
training clients loaded lazily, a held-out set, and the parameters every such
dataset shares. The files themselves are read by `fedsim.data.tff_sqlite`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import numpy as np

from fedsim.config.typed import bounded
from fedsim.data.federated import ClientBatching, Examples, FederatedData, label_outside
from fedsim.data.lazy_clients import LazyClients
from fedsim.data.tff_sqlite import DEFAULT_CACHE_DIR, SqliteSplit, open_split
from fedsim.errors import UserError
from fedsim.seeds import PARTITION_STREAM, SPLIT_STREAM

_DECODE_CHUNK = 10_000  # test-set records parsed at once, to bound peak memory


@dataclasses.dataclass(frozen=True)
class TffFileParams(ClientBatching):
  """Parameters shared by the datasets read from TFF's SQLite files."""

  cache_dir: str = DEFAULT_CACHE_DIR  # directory holding TFF's <name>.sqlite files
  # A seeded subset of the training clients (ids kept sorted); None: all of them.
  num_clients: int | None = bounded(None, min=1)
  # A seeded subset of TFF's test split as the held-out set; None: all of it.
  test_examples: int | None = bounded(None, min=1)


Decode = Callable[[Sequence[bytes]], Examples]


def choose_clients(ids: Sequence[str], num_clients: int | None, seed: int, *,
                   key: str = "data") -> tuple[str, ...]:
  """`num_clients` of `ids` drawn uniformly (stream PARTITION_STREAM), sorted; all if None.

  Raises:
    UserError: naming `{key}.num_clients` when it exceeds the population.
  """
  if num_clients is None:
    return tuple(ids)
  if num_clients > len(ids):
    raise UserError(f"{key}.num_clients: {num_clients} is more than the {len(ids)} clients"
                    " of the training split")
  rng = np.random.default_rng([seed, PARTITION_STREAM])
  return tuple(ids[i] for i in np.sort(rng.choice(len(ids), num_clients, replace=False)))


def load_test(split: SqliteSplit, decode: Decode, test_examples: int | None, seed: int, *,
              client_ids: Sequence[str] | None = None, per_client: bool = False) -> Examples:
  """The centralized held-out set from `split`, optionally a seeded subset.

  Args:
    split: the test split.
    decode: serialized protos -> `Examples`.
    test_examples: keep this many examples (stream SPLIT_STREAM), or all if None.
    seed: run seed.
    client_ids: restrict to these clients (default: the whole split).
    per_client: decode one client at a time and subsample the decoded
      examples (when an example is not one record, e.g. text windows);
      otherwise subsample records before reading them.
  """
  ids = split.client_ids if client_ids is None else client_ids
  rng = np.random.default_rng([seed, SPLIT_STREAM])
  if per_client:
    return _concat([decode(split.records(cid)) for cid in ids]).capped(test_examples, rng)
  rowids = np.concatenate([split.rowids(cid) for cid in ids])
  if test_examples is not None and test_examples < len(rowids):
    rowids = rowids[np.sort(rng.choice(len(rowids), test_examples, replace=False))]
  return _concat([decode(split.fetch(rowids[i:i + _DECODE_CHUNK]))
                  for i in range(0, len(rowids), _DECODE_CHUNK)])


def _concat(parts: Sequence[Examples]) -> Examples:
  return Examples(np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]))


def federated_data(train: SqliteSplit, test: Examples, decode: Decode, params: TffFileParams,
                   seed: int, *, num_classes: int, key: str = "data",
                   client_ids: Sequence[str] | None = None,
                   test_split: SqliteSplit | None = None,
                   one_example_per_record: bool = False) -> FederatedData:
  """Training clients of `train` loaded lazily (see `LazyClients`) plus `test`.

  Client ids are TFF's, sorted; `client_ids` (default: `choose_clients` on
  `params.num_clients`) restricts them. With `test_split`, each training
  client that has examples there gets them, uncapped and lazily loaded, as
  its own test split (`client_test`); pass it only when the splits' client
  ids name the same people (not CIFAR-100, whose test clients are another
  partition that reuses the ids). `one_example_per_record`: `decode` makes one
  example of each record, so a client's size is its metadata count and is
  known without loading it.
  """
  if client_ids is None:
    client_ids = choose_clients(train.client_ids, params.num_clients, seed, key=key)
  check = functools.partial(checked_labels, num_classes=num_classes, key=key)
  test = check(test, path=train.path, what="the test set")  # one file holds every split
  clients = LazyClients(client_ids, lambda cid: check(
      decode(train.records(cid)), path=train.path, what=f"client '{cid}'"),
                        max_examples_per_client=params.max_examples_per_client, seed=seed,
                        size=train.num_examples if one_example_per_record else None)
  client_test = None
  if test_split is not None:
    tested = set(test_split.client_ids)
    in_test = [cid for cid in client_ids if cid in tested]
    if in_test:
      client_test = LazyClients(in_test, lambda cid: check(
          decode(test_split.records(cid)), path=test_split.path,
          what=f"client '{cid}' (its test split)"),
                                max_examples_per_client=None, seed=seed,
                                size=test_split.num_examples if one_example_per_record
                                else None)
  return FederatedData(clients, test, tuple(test.x.shape[1:]), num_classes,
                       client_test=client_test)


def checked_labels(examples: Examples, *, num_classes: int, path, what: str,
                   key: str = "data") -> Examples:
  """`examples`, if every label is a class of the model (0..num_classes-1); a
  label outside would reach TensorFlow's loss as an index error mid-round.

  Raises:
    UserError: naming the file, the client (or test set) and the label.
  """
  if (bad := label_outside(examples.y, num_classes)) is not None:
    raise UserError(f"{key}.cache_dir: {path}: {what} has label {bad}, outside"
                    f" 0..{num_classes - 1}; is it the file TFF publishes?")
  return examples


def federated_from_file(dataset: str, params: TffFileParams, seed: int, *,
                        splits: tuple[str, str], decode: Callable[..., Examples],
                        num_classes: int, per_client_test: bool = False,
                        own_test: bool = False, one_example_per_record: bool = False,
                        key: str = "data") -> FederatedData:
  """The usual assembly: lazy clients of split `splits[0]`, held-out set from `splits[1]`.

  `own_test`: a training client's examples in `splits[1]` are its own test
  split (TFF split each writer's or role's data), see `federated_data`, as is
  `one_example_per_record`.

  `decode(records, path=..., key=...)` turns serialized protos into
  `Examples`. Raises UserError for a missing or damaged file.
  """
  train = open_split(dataset, params.cache_dir, splits[0], key=key)
  test_split = open_split(dataset, params.cache_dir, splits[1], key=key)
  to_examples = functools.partial(decode, path=train.path, key=key)
  test = load_test(test_split, to_examples, params.test_examples, seed,
                   per_client=per_client_test)
  return federated_data(train, test, to_examples, params, seed, num_classes=num_classes,
                        key=key, test_split=test_split if own_test else None,
                        one_example_per_record=one_example_per_record)
