"""TFF's published federated datasets: their SQLite files, read offline.

The only fedsim module that knows TFF's dataset file format. TFF 0.87's
loaders (`tff.simulation.datasets.<name>.load_data(cache_dir=...)`) read
`<cache_dir>/<file>.sqlite` and, when it is missing, try to download it; a
truncated file is trusted. fedsim never touches the network: a missing file is
a `UserError` naming the path and where TFF publishes it, and a damaged file is
detected before use.

Format (TFF `SqlClientData`): table `examples(split_name, client_id,
serialized_example_proto)` holds one serialized `tf.train.Example` per row and
table `client_metadata(client_id, split_name, num_examples)` one row per
client and split. Rows are read with `sqlite3` and parsed in bulk with
`tf.io.parse_example`: a tf.data pipeline per client costs 8-30 ms each here.
`fedsim.data.tff_files` builds a dataset's clients and test set from them.
"""

from __future__ import annotations

import os
import pathlib
import sqlite3
import threading
from typing import Mapping, Sequence

import numpy as np

from fedsim.errors import UserError

DEFAULT_CACHE_DIR = "~/.tff"  # TFF's own default (download.get_compressed_file)
PUBLISHED_AT = "https://storage.googleapis.com/tff-datasets-public/"
FILES = {  # fedsim dataset name -> file name in the cache directory (TFF 0.87)
    "emnist": "emnist_all.sqlite",
    "shakespeare": "shakespeare.sqlite",
    "stackoverflow": "stackoverflow.sqlite",
    "cifar100": "cifar100.sqlite",
}
_REQUIRED_COLUMNS = {
    "examples": {"split_name", "client_id", "serialized_example_proto"},
    "client_metadata": {"client_id", "split_name", "num_examples"},
}
# `PRAGMA quick_check` reads every page; above this size it would cost minutes,
# so big files get the O(1) header check plus row-count checks only.
_QUICK_CHECK_MAX_BYTES = 256 * 2**20
_FETCH_CHUNK = 500  # rowids per query, below SQLite's bound-parameter limit


def locate(dataset: str, cache_dir: str, *, key: str = "data") -> pathlib.Path:
  """The path of `dataset`'s SQLite file in `cache_dir` (`~` expanded).

  Raises:
    UserError: naming `{key}.cache_dir`, the exact path and the download URL
      when the file is not there.
  """
  path = pathlib.Path(os.path.expanduser(cache_dir)) / FILES[dataset]
  if not path.is_file():
    raise UserError(
        f"{key}.cache_dir: {path} not found (fedsim never downloads); TFF publishes it at"
        f" {PUBLISHED_AT}{FILES[dataset]}.lzma: decompress it (xz -d) into {path.parent}")
  return path


class SqliteSplit:
  """One split (e.g. 'train') of a TFF SQLite file, validated on open.

  Reads are thread-safe (one connection behind a lock). Client ids are
  sorted as TFF's `SqlClientData.client_ids` are.

  Attributes:
    path: the file.
    split: the split name.
    client_ids: the split's clients (from `client_metadata`), sorted.
  """

  def __init__(self, path: pathlib.Path, split: str, *, key: str = "data"):
    self.path, self.split, self._key = path, split, key
    self._lock = threading.Lock()
    _check_header(path, key)
    with self._guard():
      self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
      if path.stat().st_size <= _QUICK_CHECK_MAX_BYTES:
        result = self._db.execute("PRAGMA quick_check").fetchone()[0]
        if result != "ok":
          raise sqlite3.DatabaseError(result)
      self._check_tables()
      rows = self._db.execute(
          "SELECT client_id, num_examples FROM client_metadata WHERE split_name = ?",
          (split,)).fetchall()
    if not rows:
      raise UserError(f"{key}.cache_dir: {path} has no clients in split '{split}'; is it"
                      " the file TFF publishes?")
    self._counts = {str(cid): int(n) for cid, n in rows}
    self.client_ids = tuple(sorted(self._counts))
    self._rowids = None if self._has_client_index() else self._scan_rowids()

  def num_examples(self, client_id: str) -> int:
    """Examples of `client_id` in this split, as `client_metadata` records it."""
    return self._counts[client_id]

  def rowids(self, client_id: str) -> np.ndarray:
    """int64 rowids of the client's examples, in file order.

    Raises:
      UserError: when the file holds a different number of examples than its
        `client_metadata` says (a damaged or partial file).
    """
    if self._rowids is not None:
      found = self._rowids.get(client_id, np.zeros(0, np.int64))
    else:
      with self._guard():
        found = np.array([r for (r,) in self._db.execute(
            "SELECT rowid FROM examples WHERE client_id = ? AND split_name = ? ORDER BY rowid",
            (client_id, self.split))], np.int64)
    if len(found) != self._counts[client_id]:
      raise UserError(f"{self._key}.cache_dir: {self.path} is damaged: client '{client_id}'"
                      f" has {len(found)} rows in split '{self.split}', its metadata says"
                      f" {self._counts[client_id]}; fetch the file again")
    return found

  def fetch(self, rowids: Sequence[int]) -> list[bytes]:
    """The serialized `tf.train.Example` protos at `rowids`, in that order."""
    out: dict[int, bytes] = {}
    ids = [int(r) for r in rowids]
    with self._guard():
      for start in range(0, len(ids), _FETCH_CHUNK):
        chunk = ids[start:start + _FETCH_CHUNK]
        marks = ",".join("?" * len(chunk))
        out.update(self._db.execute(
            f"SELECT rowid, serialized_example_proto FROM examples WHERE rowid IN ({marks})",
            chunk))
    try:
      return [out[r] for r in ids]
    except KeyError as e:
      raise UserError(f"{self._key}.cache_dir: {self.path} is damaged: row {e} vanished;"
                      " fetch the file again") from None

  def records(self, client_id: str) -> list[bytes]:
    """All serialized examples of one client in this split, in file order."""
    return self.fetch(self.rowids(client_id))

  def _guard(self):
    return _Guarded(self._lock, self.path, self._key)

  def _check_tables(self) -> None:
    for table, needed in _REQUIRED_COLUMNS.items():
      have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
      if not needed <= have:
        raise UserError(f"{self._key}.cache_dir: {self.path} is not a TFF dataset file:"
                        f" table '{table}' lacks {', '.join(sorted(needed - have))}")

  def _has_client_index(self) -> bool:
    """Whether an index lets SQLite find one client's rows without a full scan."""
    with self._guard():
      plan = self._db.execute(
          "EXPLAIN QUERY PLAN SELECT rowid FROM examples WHERE client_id = ? AND"
          " split_name = ?", ("", "")).fetchall()
    return any("USING" in str(row[-1]) and "INDEX" in str(row[-1]) for row in plan)

  def _scan_rowids(self) -> dict[str, np.ndarray]:
    # Without an index each per-client query would scan the whole table, so
    # map clients to rowids in one pass (ids only: the protos stay on disk).
    by_client: dict[str, list[int]] = {}
    with self._guard():
      for cid, rowid in self._db.execute(
          "SELECT client_id, rowid FROM examples WHERE split_name = ? ORDER BY rowid",
          (self.split,)):
        by_client.setdefault(cid, []).append(rowid)
    return {cid: np.array(r, np.int64) for cid, r in by_client.items()}


class _Guarded:
  """Holds the lock; turns SQLite errors into a UserError naming the file."""

  def __init__(self, lock, path, key):
    self._lock, self._path, self._key = lock, path, key

  def __enter__(self):
    self._lock.acquire()

  def __exit__(self, kind, error, tb):
    self._lock.release()
    if isinstance(error, sqlite3.DatabaseError):
      raise UserError(f"{self._key}.cache_dir: {self._path} is corrupt or not a SQLite file"
                      f" ({error}); fetch it again") from None
    return False


def _check_header(path: pathlib.Path, key: str) -> None:
  """Rejects a file whose SQLite header is missing or promises more pages than it has."""
  with open(path, "rb") as f:
    header = f.read(100)
  if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
    raise UserError(f"{key}.cache_dir: {path} is not a SQLite file (truncated or"
                    " still compressed?); fetch it again")
  page_size = int.from_bytes(header[16:18], "big")
  page_size = 65536 if page_size == 1 else page_size
  pages = int.from_bytes(header[28:32], "big")
  # The in-header page count is only valid when the two change counters agree.
  counted = header[24:28] == header[92:96] and pages > 0
  expected = page_size * pages
  actual = path.stat().st_size
  if counted and actual < expected:
    raise UserError(f"{key}.cache_dir: {path} is truncated ({actual} of {expected} bytes);"
                    " fetch it again")


def open_split(dataset: str, cache_dir: str, split: str, *, key: str = "data") -> SqliteSplit:
  """`locate` then open and validate one split. Raises UserError as they do."""
  return SqliteSplit(locate(dataset, cache_dir, key=key), split, key=key)


def parse(records: Sequence[bytes], features: Mapping[str, tuple[tuple[int, ...], str]],
          *, path: pathlib.Path, key: str = "data") -> dict[str, np.ndarray]:
  """Parses serialized `tf.train.Example`s into NumPy arrays, all at once.

  Args:
    records: serialized protos.
    features: name -> (shape, dtype) with dtype 'float32', 'int64' or 'string'
      (TFF's `FixedLenFeature` specs).
    path: the file they came from, for error messages.

  Returns:
    name -> array of shape [len(records), *shape]; strings come back as bytes
    objects.

  Raises:
    UserError: naming `path` when a record does not parse with `features`.
  """
  import tensorflow as tf  # only needed once a real file is read

  spec = {name: tf.io.FixedLenFeature(shape, tf.as_dtype(dtype))
          for name, (shape, dtype) in features.items()}
  if not records:
    return {name: np.zeros((0, *shape), object if dtype == "string" else dtype)
            for name, (shape, dtype) in features.items()}
  try:
    parsed = tf.io.parse_example(tf.constant(list(records), tf.string), spec)
  except (tf.errors.InvalidArgumentError, ValueError) as e:
    first = str(e).strip().splitlines()[0][:160]
    raise UserError(f"{key}.cache_dir: {path} holds examples that do not parse as"
                    f" expected ({first}); is the file damaged?") from None
  return {name: value.numpy() for name, value in parsed.items()}
