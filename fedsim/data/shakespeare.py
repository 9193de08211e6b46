"""`shakespeare`: next-character prediction on TFF's `shakespeare.sqlite` (LEAF).

Each client is a speaking role of a play (715 in TFF's file); an example in the
file is a snippet of contiguous lines. Characters map to TFF's tutorial
vocabulary of 86 symbols plus 4 specials: pad 0, symbols 1-86, out-of-vocabulary
87, begin 88, end 89 (90 classes; TFF `baselines.shakespeare`).

A client's snippets, each wrapped in begin/end tokens, are laid end to end and
cut into windows of `sequence_length + 1` tokens; a window gives x = its first
T tokens and y = its last T (x int32 [n, T], y int32 [n, T]). Unlike TFF's
baseline, which pads every snippet to a multiple of T + 1, only a client's last
window is padded, so little compute goes to padding; padded positions (label
PAD) count in neither loss nor accuracy (`FederatedData.pad_label`). The
held-out set is TFF's test split of every role, cut the same way.
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

# TFF's CHAR_VOCAB (tutorial "Federated Learning for Text Generation"); all ASCII.
CHAR_VOCAB = ("dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\n"
              "aeimquyAEIMQUY]!%)-159\r")
PAD, OOV, BOS, EOS = 0, len(CHAR_VOCAB) + 1, len(CHAR_VOCAB) + 2, len(CHAR_VOCAB) + 3
NUM_CLASSES = len(CHAR_VOCAB) + 4
FEATURES = {"snippets": ((), "string")}

_CODES = np.full(128, OOV, np.int32)  # ASCII code point -> token; others are OOV
_CODES[[ord(c) for c in CHAR_VOCAB]] = np.arange(1, len(CHAR_VOCAB) + 1)


@dataclasses.dataclass(frozen=True)
class ShakespeareParams(tff_files.TffFileParams):
  sequence_length: int = bounded(80, min=1)  # tokens per example (McMahan et al. 2017)
  batch_size: int = bounded(8, min=1)


def tokenize(text: str) -> np.ndarray:
  """int32 tokens of `text` wrapped in BOS ... EOS."""
  points = np.frombuffer(text.encode("utf-32-le"), np.uint32)
  tokens = np.where(points < 128, _CODES[np.minimum(points, 127)], OOV)
  return np.concatenate([[BOS], tokens, [EOS]]).astype(np.int32)


def windows(tokens: np.ndarray, sequence_length: int) -> Examples:
  """Consecutive (x, y) windows of `tokens`; y is x shifted by one token."""
  span = sequence_length + 1
  count = max(1, -(-len(tokens) // span))
  padded = np.zeros(count * span, np.int32)
  padded[:len(tokens)] = tokens
  cut = padded.reshape(count, span)
  return Examples(np.ascontiguousarray(cut[:, :-1]), np.ascontiguousarray(cut[:, 1:]))


def decode(records: Sequence[bytes], *, path: pathlib.Path, key: str,
           sequence_length: int) -> Examples:
  """One client's snippets as windows: x, y int32 [n, sequence_length]."""
  snippets = tff_sqlite.parse(records, FEATURES, path=path, key=key)["snippets"]
  text = [tokenize(s.decode("utf-8", errors="replace")) for s in snippets]
  stream = np.concatenate(text) if text else np.zeros(0, np.int32)
  return windows(stream, sequence_length)


@DATASETS.register("shakespeare", params=ShakespeareParams)
def build(params: ShakespeareParams, seed: int, *, key: str = "data") -> FederatedData:
  """Shakespeare (TFF's file, offline): next-character prediction, one client per role."""
  # A test example is a window, not a record: cut each role's text, then subsample.
  data = tff_files.federated_from_file(
      "shakespeare", params, seed, splits=("train", "test"),
      decode=functools.partial(decode, sequence_length=params.sequence_length),
      num_classes=NUM_CLASSES, per_client_test=True, own_test=True, key=key)
  return dataclasses.replace(data, pad_label=PAD)
