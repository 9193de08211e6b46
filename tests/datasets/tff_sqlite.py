"""Writes tiny files in TFF's SQLite dataset format (as SqlClientData reads them)."""

from __future__ import annotations

import pathlib
import sqlite3
from typing import Iterable, Mapping

import numpy as np
import tensorflow as tf


def example(features: Mapping[str, object]) -> bytes:
  """A serialized tf.train.Example: floats, ints or bytes/str per feature."""
  feature = {}
  for name, value in features.items():
    if isinstance(value, (bytes, str)):
      data = value.encode() if isinstance(value, str) else value
      feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))
    else:
      array = np.asarray(value).ravel()
      if array.dtype.kind == "f":
        feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=array))
      else:
        feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=array))
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write(path: pathlib.Path, rows: Iterable[tuple[str, str, bytes]], *,
          index: bool = False) -> pathlib.Path:
  """Creates `path` with rows (split_name, client_id, serialized proto) and metadata."""
  rows = list(rows)
  with sqlite3.connect(path) as db:
    db.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL,"
               " serialized_example_proto BLOB NOT NULL)")
    db.execute("CREATE TABLE client_metadata (client_id TEXT NOT NULL,"
               " split_name TEXT NOT NULL, num_examples INTEGER NOT NULL)")
    db.executemany("INSERT INTO examples VALUES (?, ?, ?)", rows)
    counts = {}
    for split, client, _ in rows:
      counts[(client, split)] = counts.get((client, split), 0) + 1
    db.executemany("INSERT INTO client_metadata VALUES (?, ?, ?)",
                   [(c, s, n) for (c, s), n in sorted(counts.items())])
    if index:
      db.execute("CREATE INDEX examples_by_client ON examples (client_id)")
  db.close()
  return path


def emnist_rows(clients: int = 3, per_client: int = 5, test_per_client: int = 2,
                prefix: str = "digits_only", classes: int = 10):
  """Rows of a tiny EMNIST file: pixel (i, j) of example k is ((k + i + j) % 10) / 9."""
  rng = np.random.default_rng(0)
  rows = []
  for c in range(clients):
    for split, n in (("train", per_client), ("test", test_per_client)):
      for k in range(n):
        pixels = (np.add.outer(np.arange(28), np.arange(28)) + k + c) % 10 / 9.0
        rows.append((f"{prefix}_{split}", f"f{c:04d}_00",
                     example({"pixels": pixels.astype(np.float32),
                              "label": int(rng.integers(classes))})))
  return rows


LINES = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind",
         "Now is the winter of our discontent\nMade glorious summer by this sun of York;",
         "All the world's a stage, and all the men and women merely players.")


def shakespeare_rows(clients: int = 3, snippets: int = 2):
  """Rows of a tiny Shakespeare file: client c's snippet k is LINES[(c + k) % 3]."""
  rows = []
  for c in range(clients):
    role = f"THE_PLAY_ROLE{c}"
    for k in range(snippets):
      rows.append(("train", role, example({"snippets": LINES[(c + k) % 3]})))
    rows.append(("test", role, example({"snippets": LINES[c % 3][:30]})))
  return rows


SENTENCES = ("how do i sort a list", "use sorted ( ) on the list", "a list of lists",
             "why is my list empty ?")


def stackoverflow_rows(clients: int = 3):
  """Rows of a tiny Stack Overflow file: client c writes SENTENCES[c:] (train), one test."""
  rows = []
  for c in range(clients):
    user = f"{1000 + c}"
    for s in SENTENCES[c:]:
      rows.append(("train", user, example({
          "creation_date": "2010-01-01 00:00:00 UTC", "score": 1, "tags": "python",
          "title": "sorting", "tokens": s, "type": "question"})))
    rows.append(("test", user, example({
        "creation_date": "2018-06-01 00:00:00 UTC", "score": 0, "tags": "python",
        "title": "lists", "tokens": SENTENCES[-1 - c], "type": "answer"})))
  return rows


def cifar100_rows(clients: int = 2, per_client: int = 3):
  """Rows of a tiny CIFAR-100 file: image k of client c is all (10 c + k), label 7 c + k."""
  rows = []
  for split, n in (("train", clients), ("test", 1)):
    for c in range(n):
      for k in range(per_client):
        rows.append((split, str(c), example({
            "image": np.full((32, 32, 3), 10 * c + k, np.int64),
            "label": 7 * c + k, "coarse_label": c + k})))
  return rows
