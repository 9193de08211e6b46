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
one float.
"""

from __future__ import annotations

import collections

import tensorflow as tf

from fedsim.compression import tensor_encoding_api as te_api

L2, MAX = "l2", "max"
_SCALES = {L2: lambda x: tf.norm(x), MAX: lambda x: tf.reduce_max(tf.abs(x))}


@te_api.tf_style_encoding_stage
class StochasticLevelsStage(te_api.EncodingStageInterface):
  """|x| / scale rounded stochastically to `levels` steps; sign and level as one symbol.

  Encoded: `symbols` (x's shape, integers 0 .. 2 * levels, as x's float dtype)
  and `scale` (a scalar). `salt` (int32[2]) defaults to the current
  `noise_key`'s (see `tensor_encoding_api.noise_seed`).
  """

  ENCODED_VALUES_KEY = "symbols"
  SCALE_KEY = "scale"

  def __init__(self, levels: int, scale: str = L2, salt=None):
    if levels < 1:
      raise ValueError(f"levels must be >= 1, got {levels}")
    self._levels = levels
    self._scale = _SCALES[scale]
    self._scale_name = scale
    self._salt = te_api.salt_or_current(salt)

  @property
  def name(self):
    return f"levels_{self._scale_name}"

  @property
  def compressible_tensors_keys(self):
    return [self.ENCODED_VALUES_KEY]

  @property
  def commutes_with_sum(self):
    return False

  @property
  def decode_needs_input_shape(self):
    return False

  def get_params(self):
    return collections.OrderedDict(), collections.OrderedDict()

  def encode(self, x, encode_params):
    del encode_params  # Empty.
    scale = self._scale(x)
    levels = tf.cast(self._levels, x.dtype)
    scaled = tf.math.divide_no_nan(tf.abs(x), scale) * levels   # on [0, levels]
    floor = tf.floor(scaled)
    noise = tf.random.stateless_uniform(tf.shape(x), te_api.noise_seed(x, self._salt),
                                        dtype=x.dtype)
    level = tf.minimum(floor + tf.cast(noise < scaled - floor, x.dtype), levels)
    return collections.OrderedDict([
        (self.ENCODED_VALUES_KEY, tf.sign(x) * level + levels),
        (self.SCALE_KEY, scale)])

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
    del decode_params, num_summands, shape  # Unused.
    symbols = encoded_tensors[self.ENCODED_VALUES_KEY]
    levels = tf.cast(self._levels, symbols.dtype)
    return (symbols - levels) / levels * encoded_tensors[self.SCALE_KEY]
