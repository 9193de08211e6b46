from __future__ import annotations

import numpy as np
import pytest

from fedsim.data import tff_files
from fedsim.data.tff_sqlite import locate, open_split, parse
from fedsim.errors import UserError
from tests.datasets import tff_sqlite


def test_missing_file_names_path_and_source(tmp_path):
  path = tmp_path / "emnist_all.sqlite"
  with pytest.raises(UserError) as e:
    open_split("emnist", str(tmp_path), "digits_only_train", key="data")
  assert str(e.value) == (
      f"data.cache_dir: {path} not found (fedsim never downloads); TFF publishes it at"
      " https://storage.googleapis.com/tff-datasets-public/emnist_all.sqlite.lzma:"
      f" decompress it (xz -d) into {tmp_path}")


def test_cache_dir_expands_home(monkeypatch, tmp_path):
  monkeypatch.setenv("HOME", str(tmp_path))
  tff_sqlite.write(tmp_path / "cifar100.sqlite", tff_sqlite.cifar100_rows())
  assert locate("cifar100", "~") == tmp_path / "cifar100.sqlite"


def test_truncated_file_is_rejected(tmp_path):
  path = tff_sqlite.write(tmp_path / "shakespeare.sqlite", tff_sqlite.shakespeare_rows(50))
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])
  with pytest.raises(UserError, match=f"{path} is truncated"):
    open_split("shakespeare", str(tmp_path), "train")


@pytest.mark.parametrize("content", [b"", b"\xfd7zXZ\x00" + bytes(200)], ids=["empty", "xz"])
def test_non_sqlite_file_is_rejected(tmp_path, content):
  (tmp_path / "shakespeare.sqlite").write_bytes(content)
  with pytest.raises(UserError, match="is not a SQLite file"):
    open_split("shakespeare", str(tmp_path), "train")


def test_corrupt_pages_are_rejected(tmp_path):
  path = tff_sqlite.write(tmp_path / "shakespeare.sqlite", tff_sqlite.shakespeare_rows(50))
  data = bytearray(path.read_bytes())
  data[4096:8192] = b"\xff" * 4096  # the second page: garbage, same length
  path.write_bytes(bytes(data))
  with pytest.raises(UserError, match=f"{path} is (corrupt|damaged)"):
    split = open_split("shakespeare", str(tmp_path), "train")
    for cid in split.client_ids:
      split.records(cid)


def test_missing_table_is_rejected(tmp_path):
  import sqlite3
  path = tmp_path / "cifar100.sqlite"
  with sqlite3.connect(path) as db:
    db.execute("CREATE TABLE examples (split_name, client_id, serialized_example_proto)")
  db.close()
  with pytest.raises(UserError, match="table 'client_metadata' lacks client_id, num_examples"):
    open_split("cifar100", str(tmp_path), "train")


def test_unknown_split_is_rejected(cache_dir):
  with pytest.raises(UserError, match="has no clients in split 'heldout'"):
    open_split("cifar100", str(cache_dir), "heldout")


def test_rows_missing_for_metadata_are_damage(tmp_path):
  import sqlite3
  path = tff_sqlite.write(tmp_path / "cifar100.sqlite", tff_sqlite.cifar100_rows())
  with sqlite3.connect(path) as db:
    db.execute("DELETE FROM examples WHERE rowid = (SELECT MAX(rowid) FROM examples"
               " WHERE split_name = 'train' AND client_id = '1')")
  db.close()
  split = open_split("cifar100", str(tmp_path), "train")
  assert len(split.records("0")) == 3
  with pytest.raises(UserError, match="client '1' has 2 rows in split 'train', its metadata"
                     " says 3"):
    split.records("1")


def test_records_keep_file_order_with_or_without_index(cache_dir):
  split = open_split("cifar100", str(cache_dir), "train")
  assert split.client_ids == ("0", "1")
  parsed = parse(split.records("1"), {"label": ((), "int64")}, path=split.path)
  np.testing.assert_array_equal(parsed["label"], [7, 8, 9])
  assert split.fetch([6, 1]) == [*split.records("1")[2:], *split.records("0")[:1]]


def test_parse_failure_names_file(cache_dir):
  split = open_split("cifar100", str(cache_dir), "train")
  with pytest.raises(UserError, match=f"{split.path} holds examples that do not parse"):
    parse(split.records("0"), {"pixels": ((28, 28), "float32")}, path=split.path)


def test_choose_clients_is_a_seeded_sorted_subset():
  ids = [f"c{i}" for i in range(10)]
  chosen = tff_files.choose_clients(ids, 4, seed=3)
  assert chosen == tuple(sorted(chosen)) and len(set(chosen)) == 4
  assert tff_files.choose_clients(ids, 4, seed=3) == chosen
  assert tff_files.choose_clients(ids, None, seed=3) == tuple(ids)
  with pytest.raises(UserError, match="data.num_clients: 11 is more than the 10 clients"):
    tff_files.choose_clients(ids, 11, seed=0)


def _emnist_with_label(tmp_path, split, client, label):
  """A tiny digits-only EMNIST file whose `client`'s first example in `split` has `label`."""
  rows = tff_sqlite.emnist_rows()
  for i, (name, cid, _) in enumerate(rows):
    if name == f"digits_only_{split}" and cid == client:
      rows[i] = (name, cid, tff_sqlite.example({"pixels": np.zeros((28, 28), np.float32),
                                                "label": label}))
      break
  return tff_sqlite.write(tmp_path / "emnist_all.sqlite", rows)


@pytest.mark.parametrize("label", [10, -1])
def test_a_client_label_outside_the_classes_names_file_and_client(tmp_path, label):
  from fedsim.data import DATASETS
  from fedsim.config.typed import parse as parse_params
  path = _emnist_with_label(tmp_path, "train", "f0001_00", label)
  entry = DATASETS.get("emnist")
  data = entry.build(parse_params(entry.params, {"cache_dir": str(tmp_path)}, "data"), 0)
  assert len(data.clients["f0000_00"].y) == 5   # clients load lazily: the others still do
  with pytest.raises(UserError) as raised:
    data.clients["f0001_00"]
  assert str(raised.value) == (f"data.cache_dir: {path}: client 'f0001_00' has label {label},"
                               " outside 0..9; is it the file TFF publishes?")


def test_a_test_set_label_outside_the_classes_fails_the_build(tmp_path):
  from fedsim.data import DATASETS
  from fedsim.config.typed import parse as parse_params
  path = _emnist_with_label(tmp_path, "test", "f0002_00", 61)
  entry = DATASETS.get("emnist")
  with pytest.raises(UserError, match=rf"^data.cache_dir: {path}: the test set has label 61,"):
    entry.build(parse_params(entry.params, {"cache_dir": str(tmp_path)}, "data"), 0)
