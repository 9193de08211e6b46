"""Stochastic rounding to `s` levels of a tensor's scale: QSGD and TernGrad.

QSGD (Alistarh et al. 2017, "QSGD: Communication-efficient SGD via gradient
quantization and encoding"): with scale ||x||_2, each |x_i| / scale * s is
rounded to one of its two neighbouring integers l, l + 1, up with probability
equal to the remainder; Q(x)_i = scale * sign(x_i) * level_i / s. It is
unbiased and E||Q(x) - x||^2 <= min(n / s^2, sqrt(n) / s) ||x||^2.

TernGrad (Wen et al. 2017): s = 1 with scale max_i |x_i| (per tensor, the
paper's layer-wise scaling; its optional gradient clipping is not applied), so
Q(x)_i = scale * sign(x_i) * Bernoulli(|x_i| / scale): unbiased, with variance
scale * |x_i| - x_i^2 per coordinate.

The symbol sent per coordinate is sign * level + s, an integer in [0, 2s]
(bit-packed by the next stage into ceil(log2(2s + 1)) bits), plus the scale as
one float. With `bucket` = b > 0 (QSGD's bucketing; a flat input), the tensor
is zero-padded to a multiple of b and each run of b coordinates has its own
scale: ceil(n / b) floats, and the bound above holds per bucket with n = b.
"""

from __future__ import annotations

import collections

import tensorflow as tf

from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.stages.base import PerClientStage

L2, MAX = "l2", "max"


@te_api.tf_style_encoding_stage
class StochasticLevelsStage(PerClientStage):
  """|x| / scale rounded stochastically to `levels` steps; sign and level as one symbol.

  Encoded: `symbols` (x's shape, integers 0 .. 2 * levels, as x's float dtype)
  and `scale` (a scalar). `salt` (int32[2]) defaults to the current
  `noise_key`'s (see `noise_seeds.noise_seed`).
  """

  ENCODED_VALUES_KEY = "symbols"
  SCALE_KEY = "scale"

  def __init__(self, levels: int, scale: str = L2, bucket: int = 0, salt=None):
    if levels < 1:
      raise ValueError(f"levels must be >= 1, got {levels}")
    self._levels = levels
    self._bucket = bucket
    if scale not in (L2, MAX):
      raise ValueError(f"scale must be '{L2}' or '{MAX}', got {scale!r}")
    self._scale_name = scale
    self._salt = te_api.salt_or_current(salt)

  @property
  def name(self):
    return f"levels_{self._scale_name}"

  @property
  def decode_needs_input_shape(self):
    return self._bucket > 0

  def encode(self, x, encode_params):
    del encode_params  # Empty.
    if self._bucket > 0:
      x = self._buckets(x)   # [buckets, bucket]
      scale = tf.expand_dims(self._scale_of(x, axis=1), 1)
    else:
      scale = self._scale_of(x, axis=None)
    levels = tf.cast(self._levels, x.dtype)
    scaled = tf.math.divide_no_nan(tf.abs(x), scale) * levels   # on [0, levels]
    floor = tf.floor(scaled)
    noise = tf.random.stateless_uniform(tf.shape(x), te_api.noise_seed(x, self._salt),
                                        dtype=x.dtype)
    level = tf.minimum(floor + tf.cast(noise < scaled - floor, x.dtype), levels)
    return collections.OrderedDict([
        (self.ENCODED_VALUES_KEY, tf.sign(x) * level + levels),
        (self.SCALE_KEY, tf.reshape(scale, [-1]) if self._bucket > 0 else scale)])

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
    del decode_params, num_summands  # Unused.
    symbols = encoded_tensors[self.ENCODED_VALUES_KEY]
    levels = tf.cast(self._levels, symbols.dtype)
    scale = encoded_tensors[self.SCALE_KEY]
    if self._bucket > 0:
      scale = tf.expand_dims(scale, 1)
    decoded = (symbols - levels) / levels * scale
    if self._bucket > 0:   # drop the padding
      decoded = tf.slice(tf.reshape(decoded, [-1]), [0], tf.cast(shape, tf.int32))
    return decoded

  def _scale_of(self, x, axis):
    if self._scale_name == L2:
      return tf.norm(x, axis=axis)
    return tf.reduce_max(tf.abs(x), axis=axis)

  def _buckets(self, x):
    if x.shape.rank != 1 or x.shape[0] is None:
      raise ValueError(f"bucketing needs a flat tensor of known size, got {x.shape}")
    count = -(-x.shape[0] // self._bucket)
    padded = tf.pad(x, [[0, count * self._bucket - x.shape[0]]])
    return tf.reshape(padded, [count, self._bucket])
