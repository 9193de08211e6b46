"""`stackoverflow`: next-word prediction on TFF's `stackoverflow.sqlite`.

Each client is a Stack Overflow user; an example in the file is one sentence
of a question or answer, already lower-cased and tokenized (space-separated
`tokens`). As TFF's baseline does, a sentence becomes BOS + words + EOS,
truncated or padded to `sequence_length + 1` tokens, and x / y are that window
without its last / first token (int32 [n, T] each). Pad positions (label
PAD) count in neither loss nor accuracy (`FederatedData.pad_label`).

The vocabulary is built from the data itself: the `vocab_size` most frequent
words of the chosen clients' training sentences (ties broken alphabetically),
not TFF's separately published word-count file. Tokens: pad 0, words
1..vocab_size, out-of-vocabulary vocab_size + 1, BOS + 2, EOS + 3.

The full file has 342,477 training users, so `num_clients` defaults to a
seeded sample of up to 1,000 (null: all). The held-out set is TFF's `test` split of
those same users (the split is 16.6M sentences), capped by `test_examples`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import pathlib
from typing import Mapping, Sequence

import numpy as np

from fedsim.config.typed import bounded
from fedsim.data import DATASETS
from fedsim.data import tff_files, tff_sqlite
from fedsim.data.federated import Examples, FederatedData

# TFF's parse spec for stackoverflow.sqlite; fedsim reads only `tokens`.
FEATURES = {"tokens": ((), "string")}
PAD = 0  # token id of padding (words start at 1)


@dataclasses.dataclass(frozen=True)
class StackOverflowParams(tff_files.TffFileParams):
  num_clients: int | None = bounded(1000, min=1)
  test_examples: int | None = bounded(10_000, min=1)
  vocab_size: int = bounded(10_000, min=1)  # most frequent words kept
  sequence_length: int = bounded(20, min=1)  # words per example (TFF's default)


def sentences(records: Sequence[bytes], *, path: pathlib.Path, key: str) -> list[list[str]]:
  """The words of each serialized example."""
  tokens = tff_sqlite.parse(records, FEATURES, path=path, key=key)["tokens"]
  return [t.decode("utf-8", errors="replace").split() for t in tokens]


def build_vocab(counts: collections.Counter, vocab_size: int) -> dict[str, int]:
  """Word -> token id (1-based) of the `vocab_size` most frequent words."""
  ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:vocab_size]
  return {word: i + 1 for i, (word, _) in enumerate(ranked)}


def encode(words_per_sentence: Sequence[Sequence[str]], vocab: Mapping[str, int],
           sequence_length: int) -> Examples:
  """x, y int32 [n, sequence_length]: each sentence's window, shifted by one."""
  oov, bos, eos = len(vocab) + 1, len(vocab) + 2, len(vocab) + 3
  span = sequence_length + 1
  out = np.zeros((len(words_per_sentence), span), np.int32)
  for row, words in zip(out, words_per_sentence):
    ids = [bos, *(vocab.get(w, oov) for w in words), eos][:span]
    row[:len(ids)] = ids
  return Examples(out[:, :-1].copy(), out[:, 1:].copy())


def decode(records: Sequence[bytes], *, path: pathlib.Path, key: str,
           vocab: Mapping[str, int], sequence_length: int) -> Examples:
  return encode(sentences(records, path=path, key=key), vocab, sequence_length)


@DATASETS.register("stackoverflow", params=StackOverflowParams)
def build(params: StackOverflowParams, seed: int, *, key: str = "data") -> FederatedData:
  """Stack Overflow (TFF's file, offline): next-word prediction, one client per user."""
  train = tff_sqlite.open_split("stackoverflow", params.cache_dir, "train", key=key)
  test_split = tff_sqlite.open_split("stackoverflow", params.cache_dir, "test", key=key)
  wanted = params.num_clients and min(params.num_clients, len(train.client_ids))
  ids = tff_files.choose_clients(train.client_ids, wanted, seed, key=key)
  counts = collections.Counter()
  for cid in ids:  # one pass; clients are then re-read lazily when sampled
    for words in sentences(train.records(cid), path=train.path, key=key):
      counts.update(words)
  vocab = build_vocab(counts, params.vocab_size)
  to_examples = functools.partial(decode, path=train.path, key=key, vocab=vocab,
                                  sequence_length=params.sequence_length)
  tested = set(test_split.client_ids)
  in_test = [cid for cid in ids if cid in tested]
  test = tff_files.load_test(test_split, to_examples, params.test_examples, seed,
                             client_ids=in_test or None)
  # Every id in the vocabulary plus pad, OOV, BOS, EOS; a short vocabulary
  # (a tiny file) shrinks the model rather than leaving dead classes.
  data = tff_files.federated_data(train, test, to_examples, params, seed,
                                  num_classes=len(vocab) + 4, key=key, client_ids=ids,
                                  test_split=test_split)
  return dataclasses.replace(data, pad_label=PAD)
