"""The client loop's concatenated input: equal to np.concatenate, and read by
TensorFlow in place (aligned), so a round copies its clients once."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.runtime.chunks import concatenate


@pytest.mark.parametrize("rows", [[3, 2], [0, 1], [5]])
def test_concatenation_equals_numpys_and_is_aligned_for_tensorflow(rows):
  chunk = [[np.arange(r * 3, dtype=np.float32).reshape(r, 3) + 100 * i,
            np.array([i], np.int32)] for i, r in enumerate(rows)]
  data, offsets = concatenate(chunk)
  for j, leaf in enumerate(data):
    expected = np.concatenate([client[j] for client in chunk])
    assert leaf.dtype == expected.dtype and leaf.shape == expected.shape
    np.testing.assert_array_equal(leaf, expected)
    assert leaf.ctypes.data % 64 == 0 and leaf.flags.c_contiguous
  assert offsets.tolist() == [np.cumsum([0, *rows]).tolist(), list(range(len(rows) + 1))]


def test_tensorflow_reads_the_concatenation_without_copying_it():
  import tensorflow as tf
  from fedsim.backend import computations
  data, _ = concatenate([[np.ones((1000, 16), np.float32)], [np.zeros((24, 16), np.float32)]])
  (tensor,) = computations.eager_tensors([data[0]], [tf.TensorSpec([None, 16], tf.float32)])
  data[0][0, 0] = 7.0  # never done in a round: only to see the memory is shared
  assert float(tensor[0, 0]) == 7.0
