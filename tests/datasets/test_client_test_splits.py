"""Per-client test splits read from TFF's files (for `eval.federated`)."""

from __future__ import annotations

import numpy as np

from fedsim.config.typed import parse
from fedsim.data import DATASETS, shakespeare
from tests.datasets import tff_sqlite


def build(name, cache_dir, **params):
  entry = DATASETS.get(name)
  return entry.build(parse(entry.params, {"cache_dir": str(cache_dir), **params}, "data"), 0)


def test_emnist_writers_keep_their_own_test_examples(cache_dir):
  data = build("emnist", cache_dir, max_examples_per_client=1)
  assert sorted(data.client_test) == list(data.client_ids)
  own = data.client_test["f0001_00"]
  assert len(own) == 2  # uncapped: the cap is on training examples
  # Test example k of writer c has pixel (i, j) = ((k + i + j + c) % 10) / 9, as written.
  want = (np.add.outer(np.arange(28), np.arange(28)) + 1 + 1) % 10 / 9.0
  np.testing.assert_allclose(own.x[1, :, :, 0], want, rtol=1e-6)


def test_sequence_datasets_window_each_clients_own_test_text(cache_dir):
  data = build("shakespeare", cache_dir, sequence_length=20)
  role = data.client_test["THE_PLAY_ROLE1"]
  want = shakespeare.windows(shakespeare.tokenize(tff_sqlite.LINES[1][:30]), 20)
  np.testing.assert_array_equal(role.x, want.x)
  data = build("stackoverflow", cache_dir, vocab_size=3, sequence_length=5)
  user = data.client_test["1000"]  # its one test sentence: "why is my list empty ?"
  bos, oov = 5, 4
  np.testing.assert_array_equal(user.x, [[bos, oov, oov, oov, 1]])


def test_cifar100_test_clients_are_other_people(cache_dir):
  assert build("cifar100", cache_dir).client_test is None
