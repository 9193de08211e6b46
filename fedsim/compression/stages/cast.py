"""Half precision: each element sent as a 16-bit float, read back as the input's dtype.

`float16` (IEEE 754 binary16: 5 exponent bits, 10 mantissa bits) keeps ~3
decimal digits but overflows to +-inf above 65,504 and flushes below ~6e-8;
`bfloat16` (the top 16 bits of a float32: 8 exponent bits, 7 mantissa bits)
keeps float32's range at ~2 decimal digits. TensorFlow's casts round to
nearest, ties to even, for both. Nothing else is sent: the cast tensor has the
input's shape, 16 bits per element, so the compiled round sizes it exactly.
"""

from __future__ import annotations

import collections

import tensorflow as tf

from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.stages.base import PerClientStage


@te_api.tf_style_encoding_stage
class CastStage(PerClientStage):
  """float32 x -> x cast to `dtype` (a 16-bit float); decoded back to float32.

  It does not commute with the sum (a float16 sum of many clients would
  overflow and round at every addition), so the server decodes each client's
  value to float32 before summing.
  """

  def __init__(self, dtype: tf.DType):
    self._dtype = tf.as_dtype(dtype)
    if not self._dtype.is_floating:
      raise ValueError(f"dtype must be floating point, got {self._dtype.name}")

  @property
  def name(self):
    return f"cast_{self._dtype.name}"

  @property
  def compressible_tensors_keys(self):
    return []   # a float tensor: nothing to bit-pack

  def encode(self, x, encode_params):
    del encode_params  # Empty.
    if x.dtype != tf.float32:
      # decode has no dtype to go back to but the one it assumes.
      raise ValueError(f"{self.name} encodes float32 tensors, got {x.dtype.name}")
    return collections.OrderedDict([(self.ENCODED_VALUES_KEY, tf.cast(x, self._dtype))])

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
    del decode_params, num_summands, shape  # Unused.
    return tf.cast(encoded_tensors[self.ENCODED_VALUES_KEY], tf.float32)
