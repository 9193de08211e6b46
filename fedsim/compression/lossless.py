"""The lossless stage (`lossless: huffman`): the exact size of the canonical Huffman code
of the symbols an encoder bit-packs, computed inside the round (TensorFlow).

Why inside the round, and why Huffman. The symbols exist only inside the
compiled round, and the `local` runtime runs it in TFF's C++ worker, which
has no Python: a `tf.numpy_function` calling a NumPy coder (e.g.
`constriction`'s ANS or range coders) fails there with "No OpKernel was
registered to support Op 'PyFunc'" (tried on TFF 0.87). Writing an ANS or
arithmetic coder's bit stream in graph ops is a sequential loop over every
symbol of every client's tensor. A canonical Huffman code's size, in
contrast, follows from the histogram alone: its payload is the sum of the
weights of the merges that build the tree (each merge adds one bit to every
letter below it), a loop over the distinct letters (<= 256 for symbols of
up to 8 bits), and its table is the code lengths. So every runtime logs the
same exact number, and `fedsim.compression.huffman` writes that code's stream
and reads it back in NumPy (tests do so for every encoder that packs
symbols, and check its length equals this count). The stream itself is not
what crosses TFF's wire: the round still moves the packed int32 words, and
the bits logged are those of the code. The stream layout (letters of up to
8 bits, a table of code lengths, a raw fallback) is in `fedsim.compression.huffman`.

The entropy estimate (`wire_meter.entropy_bits`) stays its own column; the
Huffman code can be below it (its table, 2**L lengths of L bits, is smaller
than the estimate's histogram of counts) or above it (at least one bit per
letter: very skewed symbols, e.g. `qsgd` with one norm for a whole tensor).
"""

from __future__ import annotations

import math

import tensorflow as tf

from fedsim.compression.huffman import letter_layout

_NONE = tf.int64.max   # an empty queue's head: never the smaller


def _merge_weights(sorted_counts: tf.Tensor) -> tf.Tensor:
  """int64: the sum of the merged weights of a Huffman tree over `sorted_counts`
  (ascending, all > 0, at least two): its payload in bits. Two queues (the
  leaves, and the merged nodes in the order made, which is ascending) give
  the two smallest in O(1) each merge."""
  k = tf.size(sorted_counts)

  def smallest(i, j, t, merged):
    leaf = tf.where(i < k, sorted_counts[tf.minimum(i, k - 1)], _NONE)
    node = tf.cond(j < t, lambda: merged.read(j), lambda: tf.constant(_NONE, tf.int64))
    take_leaf = leaf <= node
    return (tf.where(take_leaf, leaf, node), i + tf.cast(take_leaf, tf.int32),
            j + 1 - tf.cast(take_leaf, tf.int32))

  def merge(i, j, t, merged, total):
    a, i, j = smallest(i, j, t, merged)
    b, i, j = smallest(i, j, t, merged)
    return i, j, t + 1, merged.write(t, a + b), total + a + b

  merged = tf.TensorArray(tf.int64, size=k - 1, clear_after_read=False,
                          element_shape=tf.TensorShape([]))
  zero = tf.constant(0, tf.int32)
  *_, total = tf.while_loop(lambda i, j, t, m, s: t < k - 1, merge,
                            (zero, zero, zero, merged, tf.constant(0, tf.int64)))
  return total


def huffman_bits(symbols: tf.Tensor, bits: int) -> tf.Tensor:
  """int64: bits of the coded stream `fedsim.compression.huffman.encode` writes for
  `symbols` (int32[n], n static, in [0, 2**bits)): 1 + min(n * bits, table + payload).

  A symbol width above 16 bits (a 2**L letter table) is not supported.
  """
  n = symbols.shape.num_elements()
  if not n:
    return tf.constant(0, tf.int64)
  if bits > 16:
    raise ValueError(f"lossless: huffman codes symbols of at most 16 bits, got {bits}")
  per, letter_bits = letter_layout(bits)
  letter_count = math.ceil(n / per)
  padded = tf.pad(tf.reshape(symbols, [-1]), [[0, letter_count * per - n]])
  shifts = tf.constant([bits * j for j in range(per)], tf.int32)
  letters = tf.reduce_sum(tf.bitwise.left_shift(tf.reshape(padded, [letter_count, per]), shifts),
                          axis=1)
  counts = tf.math.bincount(letters, minlength=2**letter_bits, maxlength=2**letter_bits,
                            dtype=tf.int64)
  used = tf.sort(tf.boolean_mask(counts, counts > 0))
  payload = tf.cond(tf.size(used) > 1, lambda: _merge_weights(used),
                    lambda: tf.constant(letter_count, tf.int64))   # one letter: 1 bit each
  table = 2**letter_bits * letter_bits
  return 1 + tf.minimum(tf.constant(n * bits, tf.int64), table + payload)
