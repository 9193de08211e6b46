"""The TFF aggregation of signSGD's majority vote (see `majority.py`).

Built on TFF's public intrinsics only: each client packs the signs of its
value into int32 words (`work` output: what crosses the wire), the server's
accumulate unpacks each client's words into +1 / -1 and adds them to
per-coordinate int32 counts, and `report` takes step * sign(counts).
"""

from __future__ import annotations

import math
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

BITS_PER_WORD = 32


def pack_signs(x: tf.Tensor) -> tf.Tensor:
  """int32[ceil(n / 32)]: bit j of word w is 1 if x[32 w + j] >= 0 (x flattened, zero-padded)."""
  flat = tf.reshape(x, [-1])
  n = flat.shape[0]
  words = math.ceil(n / BITS_PER_WORD)
  bits = tf.cast(flat >= 0, tf.int64)
  bits = tf.reshape(tf.pad(bits, [[0, words * BITS_PER_WORD - n]]), [words, BITS_PER_WORD])
  packed = tf.reduce_sum(bits * (2 ** np.arange(BITS_PER_WORD, dtype=np.int64)), axis=1)
  # Words above 2**31 - 1 become their two's-complement int32 (same 32 bits).
  return tf.cast(packed - tf.where(packed >= 2**31, np.int64(2**32), np.int64(0)), tf.int32)


def unpack_votes(words: tf.Tensor, n: int) -> tf.Tensor:
  """int32[n]: +1 where `pack_signs` set a bit, -1 where it did not."""
  unsigned = tf.bitwise.bitwise_and(tf.cast(words, tf.int64), np.int64(2**32 - 1))
  shifts = np.arange(BITS_PER_WORD, dtype=np.int64)
  bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(unsigned[:, None], shifts), 1)
  return tf.cast(2 * tf.reshape(bits, [-1])[:n] - 1, tf.int32)


def _vote_process(value_type, step: float) -> tff.templates.AggregationProcess:
  specs = tf.nest.flatten(tff.types.type_to_tf_tensor_specs(value_type))
  for spec in specs:
    if not spec.dtype.is_floating or not spec.shape.is_fully_defined():
      raise TypeError(f"majority_vote needs float tensors of known shape, got {spec}")
  sizes = [int(np.prod(spec.shape.as_list())) for spec in specs]

  @tff.tensorflow.computation(value_type)
  def encode(value):
    return [pack_signs(x) for x in tf.nest.flatten(value)]

  @tff.tensorflow.computation
  def zeros():
    return [tf.zeros([n], tf.int32) for n in sizes]

  counts_type = zeros.type_signature.result

  @tff.tensorflow.computation(counts_type, encode.type_signature.result)
  def accumulate(counts, words):
    return [c + unpack_votes(w, n) for c, w, n in zip(counts, words, sizes)]

  @tff.tensorflow.computation(counts_type, counts_type)
  def merge(a, b):
    return [x + y for x, y in zip(a, b)]

  @tff.tensorflow.computation(counts_type)
  def report(counts):
    return counts

  @tff.tensorflow.computation(counts_type)
  def vote(counts):
    signs = [tf.reshape(tf.cast(tf.sign(c), s.dtype) * tf.cast(step, s.dtype), s.shape)
             for c, s in zip(counts, specs)]
    return tf.nest.pack_sequence_as(tff.types.type_to_tf_tensor_specs(value_type), signs)

  @tff.tensorflow.computation(counts_type)
  def measure(counts):
    ties = tf.add_n([tf.reduce_sum(tf.cast(tf.equal(c, 0), tf.float32)) for c in counts])
    return {"tie_fraction": ties / float(sum(sizes))}

  @tff.federated_computation()
  def init():
    return tff.federated_value((), tff.SERVER)

  @tff.federated_computation(init.type_signature.result,
                             tff.FederatedType(value_type, tff.CLIENTS))
  def next_fn(state, value):
    counts = tff.federated_aggregate(tff.federated_map(encode, value), zeros(), accumulate,
                                     merge, report)
    return tff.templates.MeasuredProcessOutput(
        state, tff.federated_map(vote, counts), tff.federated_map(measure, counts))

  return tff.templates.AggregationProcess(init, next_fn)


class SignVoteFactory(tff.aggregators.UnweightedAggregationFactory):
  """The majority-vote aggregation: its result is step * sign(sum of the
  clients' signs) per coordinate; its measurement `tie_fraction` the share of
  coordinates whose vote tied (result 0)."""

  def __init__(self, step: float):
    self._step = step

  def create(self, value_type):
    return _vote_process(value_type, self._step)
