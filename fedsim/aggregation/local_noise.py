"""The client-side clip and Gaussian noise of `local_dp` (see local_dp.py), as
an unweighted `tff.aggregators` factory around the rest of the chain."""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class LocalGaussianFactory(tff.aggregators.UnweightedAggregationFactory):
  """Clip and noise on the clients, then `inner`. State {inner, round} (the
  round seeds the noise); measurements {clipped_count, noised: inner's}."""

  def __init__(self, inner, clip: float, stddev: float, salt: tuple[int, int]):
    self._inner, self._clip, self._stddev, self._salt = inner, float(clip), float(stddev), salt

  def create(self, value_type):
    inner = self._inner.create(value_type)
    clip, stddev, salt = self._clip, self._stddev, self._salt

    @tff.tensorflow.computation(value_type, np.int64)
    def clip_and_noise(value, round_index):
      leaves = tf.nest.flatten(value)
      norm = tf.linalg.global_norm(leaves)
      factor = tf.minimum(1.0, clip / tf.maximum(norm, 1e-30))
      clipped = [x * tf.cast(factor, x.dtype) for x in leaves]
      flat = tf.concat([tf.reshape(tf.cast(x, tf.float32), [-1]) for x in clipped], 0)
      fingerprint = tf.bitcast(tf.reshape(tf.fingerprint(flat[None, :]), [2, 4]), tf.int32)
      seed = tf.random.experimental.stateless_fold_in(
          tf.bitwise.bitwise_xor(fingerprint, tf.constant(salt, tf.int32)),
          tf.cast(round_index, tf.int32))
      noised = []
      for i, x in enumerate(clipped):
        noise = tf.random.stateless_normal(
            tf.shape(x), tf.random.experimental.stateless_fold_in(seed, i), stddev=stddev)
        noised.append(x + tf.cast(noise, x.dtype))
      return tf.nest.pack_sequence_as(value, noised), tf.cast(norm > clip, tf.int32)

    @tff.tensorflow.computation
    def first_round():
      return tf.constant(0, tf.int64)

    @tff.tensorflow.computation(np.int64)
    def next_round(round_index):
      return round_index + 1

    @tff.federated_computation()
    def init_fn():
      return tff.federated_zip(collections.OrderedDict(
          inner=inner.initialize(), round=tff.federated_eval(first_round, tff.SERVER)))

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      client_out = tff.federated_map(
          clip_and_noise, (value, tff.federated_broadcast(state.round)))
      out = inner.next(state.inner, client_out[0])
      new_state = tff.federated_zip(collections.OrderedDict(
          inner=out.state, round=tff.federated_map(next_round, state.round)))
      measurements = tff.federated_zip(collections.OrderedDict(
          clipped_count=tff.federated_sum(client_out[1]), noised=out.measurements))
      return tff.templates.MeasuredProcessOutput(new_state, out.result, measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)
