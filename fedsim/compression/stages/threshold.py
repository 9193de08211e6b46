"""Threshold sparsification: send the coordinates whose magnitude reaches tau.

The kept coordinates of a flat tensor x are {i : |x_i| >= tau} (Strom 2015's
threshold quantization without its 1-bit residual trick; with error feedback
the dropped part is carried over instead). What is sent is their values (m
floats) and their indices (m int32, 32 bits each as sent: no packing), m
depending on x: the encoded shapes are [None], so static sizing cannot count
them and the server measures them per client and round
(`fedsim.compression.wire_meter`, `variable_bits`). A client with nothing
above tau sends two empty tensors.
"""

from __future__ import annotations

import collections

import tensorflow as tf

from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.stages.base import PerClientStage


@te_api.tf_style_encoding_stage
class ThresholdStage(PerClientStage):
  """Flat x -> the values with |x_i| >= tau and their int32 indices (both shaped [None])."""

  INDICES_KEY = "indices"

  def __init__(self, tau: float):
    if not tau > 0:
      raise ValueError(f"tau must be > 0, got {tau}")
    self._tau = tau

  @property
  def name(self):
    return "threshold"

  @property
  def decode_needs_input_shape(self):
    return True

  def encode(self, x, encode_params):
    del encode_params  # Empty.
    if x.shape.rank != 1:
      raise ValueError(f"threshold needs a flat tensor, got {x.shape}"
                       " (chain it after FlattenEncodingStage)")
    indices = tf.cast(tf.reshape(tf.where(tf.abs(x) >= tf.cast(self._tau, x.dtype)), [-1]),
                      tf.int32)
    return collections.OrderedDict([(self.ENCODED_VALUES_KEY, tf.gather(x, indices)),
                                    (self.INDICES_KEY, indices)])

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
    del decode_params, num_summands  # Unused.
    indices = tf.expand_dims(encoded_tensors[self.INDICES_KEY], 1)
    return tf.scatter_nd(indices, encoded_tensors[self.ENCODED_VALUES_KEY],
                         tf.cast(shape, tf.int32))
