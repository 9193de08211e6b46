"""Comparing two runs' final_model.npz files written by different processes."""

from __future__ import annotations

import pathlib
import re

import numpy as np


def _uncounted(name: str) -> str:
  """`dense_3/kernel` -> `dense/kernel`."""
  return re.sub(r"_\d+(?=/)", "", name)


def assert_same_final_model(got: pathlib.Path, want: pathlib.Path) -> None:
  """Equal arrays in file order, under names equal but for Keras's per-process
  layer counter (a process that built models before names its next 'dense_1')."""
  with np.load(got) as a, np.load(want) as b:
    assert [_uncounted(n) for n in a.files] == [_uncounted(n) for n in b.files]
    for name, other in zip(a.files, b.files, strict=True):
      np.testing.assert_array_equal(a[name], b[other])
