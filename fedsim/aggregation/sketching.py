"""The TFF aggregation of FetchSGD's count sketch (see `count_sketch.py`).

Built on TFF's public intrinsics: clients map their update to its sketch
(`work` output: what crosses the wire, r x c float32), the inner factory (the
mean over a plain or secure sum) aggregates the sketches, and the server keeps
momentum and error in sketch space in this process's state and unsketches the
top-k coordinates. The hash and sign functions are stateless TensorFlow draws
from one seed, so every client and the server compute the same ones without
sending them.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.seeds import SKETCH_STREAM


def hash_seed(run_seed: int, index: int) -> np.ndarray:
  """int32[2]: the seed of the hash and sign functions of the stage at `index` of a chain."""
  words = np.random.default_rng([run_seed, SKETCH_STREAM, index]).integers(0, 2**32, 2)
  return words.astype(np.uint32).view(np.int32)


def hashes(d: int, rows: int, columns: int, seed) -> tuple[tf.Tensor, tf.Tensor]:
  """(buckets int32[rows, d] uniform in [0, columns), signs float32[rows, d] uniform +-1)."""
  seed = tf.constant(seed, tf.int32)
  fold = tf.random.experimental.stateless_fold_in
  buckets = tf.random.stateless_uniform([rows, d], fold(seed, 0), minval=0, maxval=columns,
                                        dtype=tf.int32)
  bits = tf.random.stateless_uniform([rows, d], fold(seed, 1), minval=0, maxval=2,
                                     dtype=tf.int32)
  return buckets, tf.cast(2 * bits - 1, tf.float32)


def sketch(vector: tf.Tensor, buckets: tf.Tensor, signs: tf.Tensor, columns: int) -> tf.Tensor:
  """float32[rows, columns]: S[j, buckets[j, t]] = sum of signs[j, t] * vector[t]."""
  rows = buckets.shape[0]
  cells = buckets + columns * tf.range(rows)[:, None]
  summed = tf.math.unsorted_segment_sum(tf.reshape(signs * vector[None, :], [-1]),
                                        tf.reshape(cells, [-1]), rows * columns)
  return tf.reshape(summed, [rows, columns])


def unsketch(table: tf.Tensor, buckets: tf.Tensor, signs: tf.Tensor) -> tf.Tensor:
  """float32[d]: each coordinate's median over rows of signs[j, t] * table[j, buckets[j, t]]."""
  rows, columns = table.shape
  cells = buckets + columns * tf.range(rows)[:, None]
  estimates = tf.sort(signs * tf.gather(tf.reshape(table, [-1]), cells), axis=0)
  return (estimates[(rows - 1) // 2] + estimates[rows // 2]) / 2   # the median, as NumPy's


def top_k(vector: tf.Tensor, k: int) -> tf.Tensor:
  """`vector` with all but its k largest magnitudes set to 0 (of equal ones, the
  lowest indices are kept: coordinates sharing buckets often tie)."""
  kept = tf.math.top_k(tf.abs(vector), min(k, vector.shape[0]), sorted=True).indices
  return tf.scatter_nd(kept[:, None], tf.gather(vector, kept), vector.shape)


def _process(value_type, inner, weight_type, rows, columns, k, momentum, seed):
  structure = tff.types.type_to_tf_tensor_specs(value_type)
  specs = tf.nest.flatten(structure)
  for spec in specs:
    if not spec.dtype.is_floating or not spec.shape.is_fully_defined():
      raise TypeError(f"count_sketch needs float tensors of known shape, got {spec}")
  sizes = [spec.shape.num_elements() for spec in specs]
  d = sum(sizes)
  table_type = tff.TensorType(np.float32, [rows, columns])
  inner_process = inner.create(table_type, *([] if weight_type is None else [weight_type]))

  @tff.tensorflow.computation(value_type)
  def client_sketch(value):
    flat = tf.concat([tf.reshape(tf.cast(x, tf.float32), [-1])
                      for x in tf.nest.flatten(value)], 0)
    return sketch(flat, *hashes(d, rows, columns, seed), columns)

  @tff.tensorflow.computation
  def zero_table():
    return tf.zeros([rows, columns], tf.float32)

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(collections.OrderedDict(
        sketch_sum=inner_process.initialize(),
        momentum=tff.federated_eval(zero_table, tff.SERVER),
        error=tff.federated_eval(zero_table, tff.SERVER)))

  @tff.tensorflow.computation(table_type, table_type, table_type)
  def server_update(summed, velocity, error):
    # Without momentum, no product with the old velocity: 0 * v folded by
    # grappler inside the compiled round left a placeholder unfed (inprocess).
    velocity = momentum * velocity + summed if momentum else summed
    error = error + velocity
    buckets, signs = hashes(d, rows, columns, seed)
    delta = top_k(unsketch(error, buckets, signs), k)
    error = tf.where(tf.equal(sketch(delta, buckets, signs, columns), 0.0), error, 0.0)
    parts = tf.split(delta, sizes)
    update = tf.nest.pack_sequence_as(
        structure, [tf.cast(tf.reshape(p, s.shape), s.dtype) for p, s in zip(parts, specs)])
    return update, velocity, error, tf.norm(error)

  def next_body(state, value, weight):
    sketches = tff.federated_map(client_sketch, value)
    summed = (inner_process.next(state.sketch_sum, sketches) if weight is None
              else inner_process.next(state.sketch_sum, sketches, weight))
    out = tff.federated_map(server_update, (summed.result, state.momentum, state.error))
    new_state = tff.federated_zip(collections.OrderedDict(
        sketch_sum=summed.state, momentum=out[1], error=out[2]))
    measurements = tff.federated_zip(collections.OrderedDict(
        error_norm=out[3], sketch_sum=summed.measurements))
    return tff.templates.MeasuredProcessOutput(new_state, out[0], measurements)

  state_type = init_fn.type_signature.result
  clients = tff.FederatedType(value_type, tff.CLIENTS)
  if weight_type is None:
    next_fn = tff.federated_computation(lambda state, value: next_body(state, value, None),
                                        state_type, clients)
  else:
    next_fn = tff.federated_computation(
        lambda state, value, weight: next_body(state, value, weight), state_type, clients,
        tff.FederatedType(weight_type, tff.CLIENTS))
  return tff.templates.AggregationProcess(init_fn, next_fn)


class _Weighted(tff.aggregators.WeightedAggregationFactory):

  def __init__(self, inner, *config):
    self._inner, self._config = inner, config

  def create(self, value_type, weight_type):
    return _process(value_type, self._inner, weight_type, *self._config)


class _Unweighted(tff.aggregators.UnweightedAggregationFactory):

  def __init__(self, inner, *config):
    self._inner, self._config = inner, config

  def create(self, value_type):
    return _process(value_type, self._inner, None, *self._config)


def FetchSGDFactory(inner, rows: int, columns: int, k: int, momentum: float, seed):  # noqa: N802
  """FetchSGD's aggregation around `inner` (a mean or sum factory of the sketches),
  weighted if `inner` is; its result is the unsketched top-k update, its state
  `{sketch_sum, momentum, error}` (the two r x c tables), its measurements
  `{error_norm, sketch_sum}` (L2 norm of the error table after the round)."""
  kind = (_Weighted if isinstance(inner, tff.aggregators.WeightedAggregationFactory)
          else _Unweighted)
  return kind(inner, rows, columns, k, momentum, seed)
