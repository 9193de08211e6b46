"""One bit per coordinate and one scale: scaled signSGD and DRIVE's quantizer.

The symbol of x_i is 1 if x_i >= 0 else 0; decoding gives scale * (+1 / -1).
The scale is one float, chosen as:

- `mean_abs`: ||x||_1 / n, the scale minimizing ||x - scale * sign(x)||_2
  (scaled signSGD, Karimireddy et al. 2019; DRIVE's biased variant);
- `unbiased`: ||x||_2^2 / ||x||_1, DRIVE's (Vargaftik et al. 2021) scale that
  makes the estimate unbiased when x has been uniformly randomly rotated
  (then <x, scale * sign(x)> = ||x||_2^2).
"""

from __future__ import annotations

import collections

import tensorflow as tf

from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.stages.base import PerClientStage

MEAN_ABS, UNBIASED = "mean_abs", "unbiased"


def _mean_abs(x):
  return tf.reduce_mean(tf.abs(x))


def _unbiased(x):
  return tf.math.divide_no_nan(tf.reduce_sum(tf.square(x)), tf.reduce_sum(tf.abs(x)))


_SCALES = {MEAN_ABS: _mean_abs, UNBIASED: _unbiased}


@te_api.tf_style_encoding_stage
class SignStage(PerClientStage):
  """x -> (bits 1 for x_i >= 0 / 0 for x_i < 0, as x's dtype; one scale)."""

  ENCODED_VALUES_KEY = "signs"
  SCALE_KEY = "scale"

  def __init__(self, scale: str = MEAN_ABS):
    self._scale = _SCALES[scale]
    self._scale_name = scale

  @property
  def name(self):
    return f"sign_{self._scale_name}"

  def encode(self, x, encode_params):
    del encode_params  # Empty.
    return collections.OrderedDict([
        (self.ENCODED_VALUES_KEY, tf.cast(x >= 0, x.dtype)),
        (self.SCALE_KEY, self._scale(x))])

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
    del decode_params, num_summands, shape  # Unused.
    bits = encoded_tensors[self.ENCODED_VALUES_KEY]
    return (2 * bits - 1) * encoded_tensors[self.SCALE_KEY]
