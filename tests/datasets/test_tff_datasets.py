"""The four TFF-file datasets, built from tiny files through the registry."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from fedsim.config.typed import parse
from fedsim.data import DATASETS
from fedsim.data import shakespeare, stackoverflow
from fedsim.errors import UserError
from tests.datasets import tff_sqlite


def build(name, cache_dir, seed=0, **params):
  entry = DATASETS.get(name)
  return entry.build(parse(entry.params, {"cache_dir": str(cache_dir), **params}, "data"), seed)


def test_emnist_digits(cache_dir):
  data = build("emnist", cache_dir)
  assert data.client_ids == ("f0000_00", "f0001_00", "f0002_00")
  assert (data.input_shape, data.num_classes, len(data.test)) == ((28, 28, 1), 10, 6)
  client = data.clients["f0001_00"]
  assert client.x.dtype == np.float32 and client.y.dtype == np.int32
  assert client.x.shape == (5, 28, 28, 1)
  # Pixel (i, j) of example k of client c is ((k + i + j + c) % 10) / 9, as written.
  np.testing.assert_allclose(client.x[2, 3, 4, 0], ((2 + 3 + 4 + 1) % 10) / 9, rtol=1e-6)
  inverted = build("emnist", cache_dir, invert_pixels=True).clients["f0001_00"]
  np.testing.assert_allclose(inverted.x, 1 - client.x, rtol=1e-6)


def test_emnist_all_classes_reads_the_all_splits(cache_dir):
  data = build("emnist", cache_dir, only_digits=False)
  assert (data.num_classes, data.client_ids, len(data.test)) == (62, ("f0000_00", "f0001_00"), 4)


def test_emnist_subsets_are_seeded(cache_dir):
  data = build("emnist", cache_dir, num_clients=2, test_examples=4, max_examples_per_client=3,
               seed=5)
  again = build("emnist", cache_dir, num_clients=2, test_examples=4, max_examples_per_client=3,
                seed=5)
  assert len(data.client_ids) == 2 and data.client_ids == again.client_ids
  assert [len(c) for c in data.clients.values()] == [3, 3]
  np.testing.assert_array_equal(data.test.x, again.test.x)
  assert len(data.test) == 4
  for cid in data.client_ids:
    np.testing.assert_array_equal(data.clients[cid].x, again.clients[cid].x)


@pytest.mark.parametrize("name", ["emnist", "cifar100"])
def test_one_example_per_record_sizes_need_no_loading(cache_dir, name):
  data = build(name, cache_dir, max_examples_per_client=2)
  sizes = [data.client_size(c) for c in data.client_ids]
  assert data.clients._cache == {}  # from the metadata, capped
  assert sizes == [len(data.clients[c]) for c in data.client_ids]
  assert max(sizes) == 2  # the cap binds


def test_emnist_missing_file_is_a_user_error(tmp_path):
  with pytest.raises(UserError, match=r"data.cache_dir: .*emnist_all.sqlite not found"):
    build("emnist", tmp_path)


def test_shakespeare_tokens_follow_tff_vocabulary():
  assert shakespeare.NUM_CLASSES == 90 and len(shakespeare.CHAR_VOCAB) == 86
  np.testing.assert_array_equal(shakespeare.tokenize("dh\u00e9"), [88, 1, 2, 87, 89])
  windows = shakespeare.windows(np.arange(1, 8, dtype=np.int32), sequence_length=3)
  np.testing.assert_array_equal(windows.x, [[1, 2, 3], [5, 6, 7]])
  np.testing.assert_array_equal(windows.y, [[2, 3, 4], [6, 7, 0]])


def test_shakespeare_clients_are_windows_of_their_snippets(cache_dir):
  data = build("shakespeare", cache_dir, sequence_length=20)
  assert data.client_ids == ("THE_PLAY_ROLE0", "THE_PLAY_ROLE1", "THE_PLAY_ROLE2")
  assert (data.input_shape, data.num_classes) == ((20,), 90)
  client = data.clients["THE_PLAY_ROLE0"]
  stream = np.concatenate([shakespeare.tokenize(tff_sqlite.LINES[0]),
                           shakespeare.tokenize(tff_sqlite.LINES[1])])
  expected = shakespeare.windows(stream, 20)
  np.testing.assert_array_equal(client.x, expected.x)
  np.testing.assert_array_equal(client.y, expected.y)
  assert client.x.dtype == np.int32 and client.y.shape == client.x.shape
  # Test split: one 30-character snippet per role = 32 tokens = 2 windows of 21.
  assert data.test.x.shape == (6, 20)


def test_stackoverflow_vocabulary_from_training_sentences(cache_dir):
  data = build("stackoverflow", cache_dir, vocab_size=3, sequence_length=5)
  assert data.client_ids == ("1000", "1001", "1002")
  # Training words over the 3 users: "list" x7 ... "a" x5, "the" x3 (ties alphabetical).
  counts = {}
  for c in range(3):
    for s in tff_sqlite.SENTENCES[c:]:
      for w in s.split():
        counts[w] = counts.get(w, 0) + 1
  vocab = stackoverflow.build_vocab(collections.Counter(counts), 3)
  assert list(vocab) == ["list", "a", "?"] and data.num_classes == 3 + 4
  client = data.clients["1002"]  # "a list of lists", "why is my list empty ?"
  bos, eos, oov = 5, 6, 4
  np.testing.assert_array_equal(client.x, [[bos, 2, 1, oov, oov], [bos, oov, oov, oov, 1]])
  np.testing.assert_array_equal(client.y, [[2, 1, oov, oov, eos], [oov, oov, oov, 1, oov]])
  assert len(data.test) == 3


def test_cifar100_scaled_images_and_labels(cache_dir):
  data = build("cifar100", cache_dir)
  assert (data.client_ids, data.input_shape, data.num_classes) == (("0", "1"), (32, 32, 3), 100)
  client = data.clients["1"]
  np.testing.assert_allclose(client.x[:, 0, 0, 0], np.array([10, 11, 12]) / 255, rtol=1e-6)
  np.testing.assert_array_equal(client.y, [7, 8, 9])
  coarse = build("cifar100", cache_dir, coarse_labels=True)
  np.testing.assert_array_equal(coarse.clients["1"].y, [1, 2, 3])
  assert coarse.num_classes == 20 and len(coarse.test) == 3


def test_clients_load_lazily_and_cache(cache_dir, monkeypatch):
  data = build("cifar100", cache_dir)
  calls = []
  load = data.clients._load
  monkeypatch.setattr(data.clients, "_load", lambda cid: calls.append(cid) or load(cid))
  first = data.clients["0"]
  assert data.clients["0"] is first and calls == ["0"]
  assert "1" in data.clients and calls == ["0"]  # membership does not load
