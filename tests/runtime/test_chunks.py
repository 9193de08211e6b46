"""The client loop's concatenated input: equal to np.concatenate, and read by
TensorFlow in place (aligned), so a round copies its clients once, and not at all
when they already lie end to end in one buffer (states a round stacked)."""

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


def _stacked(clients, shape):
  """Rows of one aligned [clients, *shape] array, as a round's stacked new states come back."""
  import tensorflow as tf
  stacked = np.asarray(tf.reshape(tf.range(clients * int(np.prod(shape)), dtype=tf.float32),
                                  [clients, *shape]))
  return stacked, [stacked[i] for i in range(clients)]


@pytest.mark.parametrize("shape", [(3, 2), (5,)])
def test_rows_of_one_buffer_in_order_are_viewed_not_copied(shape):
  stacked, rows = _stacked(4, shape)
  flat = (-1, *shape[1:])  # as `chunks` hands leaves over
  for clients in (rows, rows[:2]):  # the whole stack, or its first rows
    (leaf,), offsets = concatenate([[r.reshape(flat)] for r in clients])
    np.testing.assert_array_equal(leaf, np.concatenate([r.reshape(flat) for r in clients]))
    assert leaf.ctypes.data == stacked.ctypes.data and not leaf.flags.writeable
    assert offsets[0, -1] == len(leaf)


def test_rows_out_of_order_or_from_two_buffers_are_copied():
  stacked, rows = _stacked(3, (2, 2))
  _, other = _stacked(1, (2, 2))
  for clients in ([rows[1], rows[0]], [rows[0], rows[2]], [rows[0], other[0]]):
    (leaf,), _ = concatenate([[r] for r in clients])
    np.testing.assert_array_equal(leaf, np.concatenate(clients))
    assert leaf.ctypes.data != stacked.ctypes.data and leaf.ctypes.data % 64 == 0
