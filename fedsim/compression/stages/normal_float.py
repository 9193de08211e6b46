"""Blockwise 4-bit NormalFloat (NF4) quantization (Dettmers et al. 2023, "QLoRA:
Efficient finetuning of quantized LLMs", section 3 and its bitsandbytes code).

NormalFloat's levels are quantiles of N(0, 1), so each of the 16 levels gets
an equal share of a normal tensor's elements. The paper wants an exact zero,
which a symmetric 2^k-level grid does not have, so NF4 is asymmetric: 8
positive levels Q(p_i), p_i equally spaced from delta down to 1/2 (excluded),
7 negative levels -Q(p_j), p_j equally spaced from delta down to 1/2 in 7
steps, and 0; all divided by Q(delta) to lie in [-1, 1]. Q is N(0, 1)'s
quantile function and delta = (1 - 1/(2*15) + 1 - 1/(2*16)) / 2 = 0.9677083,
the mean of the outermost quantile probabilities of a 15- and a 16-level grid
(the `offset` of bitsandbytes' `create_normal_map`: the paper's Q(1) is
infinite).

A flat tensor of n elements is cut into blocks of `block_size` (the last one
short); each block is divided by its absolute maximum (absmax), every element
rounded to the nearest level, and its 4-bit index sent: n indices (bit-packed
by the next stage) and ceil(n / block_size) float32 absmax values. Decoding is
level[index] * absmax. Deterministic and biased (nearest rounding).
"""

from __future__ import annotations

import collections
import functools
import statistics

import numpy as np
import tensorflow as tf

from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.stages.base import PerClientStage

BITS = 4


@functools.lru_cache(maxsize=None)
def nf4_levels() -> tuple[float, ...]:
  """The 16 NF4 levels, ascending, from -1 to 1 with an exact 0 (float64)."""
  quantile = statistics.NormalDist().inv_cdf
  delta = (1 - 1 / (2 * 15) + 1 - 1 / (2 * 16)) / 2
  half = 2**(BITS - 1)   # positive levels; one fewer negative, as 0 takes a slot
  positive = [quantile(delta - i * (delta - 0.5) / half) for i in range(half)]
  negative = [-quantile(delta - j * (delta - 0.5) / (half - 1)) for j in range(half - 1)]
  top = quantile(delta)
  return tuple(sorted(v / top for v in positive + negative + [0.0]))


@te_api.tf_style_encoding_stage
class NormalFloatStage(PerClientStage):
  """Flat x -> NF4 indices (x's length, integers 0..15 as x's dtype) and one absmax per block."""

  ENCODED_VALUES_KEY = "symbols"
  ABSMAX_KEY = "absmax"

  def __init__(self, block_size: int = 64):
    if block_size < 1:
      raise ValueError(f"block_size must be >= 1, got {block_size}")
    self._block = block_size
    self._levels = np.asarray(nf4_levels(), np.float32)

  @property
  def name(self):
    return "normal_float_4"

  def encode(self, x, encode_params):
    del encode_params  # Empty.
    if x.shape.rank != 1 or x.shape[0] is None:
      raise ValueError(f"{self.name} needs a flat tensor of known size, got {x.shape}"
                       " (chain it after FlattenEncodingStage)")
    n = x.shape[0]
    blocks = self._blocks(x)
    absmax = tf.reduce_max(tf.abs(blocks), axis=1)
    normalized = tf.math.divide_no_nan(blocks, absmax[:, None])   # an all-zero block: 0
    # Nearest level: the midpoints between levels bound each one's interval.
    midpoints = ((self._levels[1:].astype(np.float64) + self._levels[:-1]) / 2).tolist()
    index = tf.raw_ops.Bucketize(input=normalized, boundaries=midpoints)
    symbols = tf.reshape(index, [-1])[:n]   # the padding is not sent
    return collections.OrderedDict([(self.ENCODED_VALUES_KEY, tf.cast(symbols, x.dtype)),
                                    (self.ABSMAX_KEY, absmax)])

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
    del decode_params, num_summands, shape  # Unused: n is the number of symbols.
    symbols = encoded_tensors[self.ENCODED_VALUES_KEY]
    absmax = encoded_tensors[self.ABSMAX_KEY]
    levels = tf.gather(tf.constant(self._levels, absmax.dtype), tf.cast(symbols, tf.int32))
    return tf.reshape(self._blocks(levels) * absmax[:, None], [-1])[:tf.size(symbols)]

  def _blocks(self, flat):
    """[ceil(n / block_size), block_size]: `flat` zero-padded to whole blocks."""
    # A static length keeps the encoded shapes static, as sizing needs.
    n = flat.shape[0] if flat.shape.is_fully_defined() else tf.size(flat)
    padded = tf.pad(flat, [[0, (-n) % self._block]])
    return tf.reshape(padded, [-1, self._block])
