"""Sparsification: send k of a flat tensor's n coordinates.

top-k keeps the k largest |x_i| (Aji & Heafield 2017; Stich et al. 2018) and
sends their values (k floats) and indices (k int32, 32 bits each as sent: no
packing). random-k keeps k coordinates drawn uniformly without replacement; it
sends the values and the 64-bit seed of the draw (int32[2]), from which the
server draws the same indices. Unbiased random-k scales the values by n / k
(E[decoded] = x, variance x_i^2 (n / k - 1) per coordinate).

k is `k` if positive, else ceil(fraction * n), at least 1 and at most n; it
is fixed by the tensor's size, so the encoded shapes are static.
"""

from __future__ import annotations

import collections
import math

import tensorflow as tf

from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.stages.base import PerClientStage


def kept_coordinates(n: int, fraction: float, k: int = 0) -> int:
  """How many of `n` coordinates are sent: `k` if positive, else ceil(fraction * n), in [1, n]."""
  wanted = k if k > 0 else math.ceil(fraction * n)
  return max(1, min(n, wanted))


class _Sparsify(PerClientStage):
  """Shared shape of both stages: flat x [n] -> values [k] + how to find their indices."""

  def __init__(self, fraction: float = 0.01, k: int = 0):
    self._fraction, self._k = fraction, k

  @property
  def decode_needs_input_shape(self):
    return True

  def _count(self, x) -> int:
    if x.shape.rank != 1 or x.shape[0] is None:
      raise ValueError(f"{self.name} needs a flat tensor of known size, got {x.shape}"
                       " (chain it after FlattenEncodingStage)")
    return kept_coordinates(x.shape[0], self._fraction, self._k)

  @staticmethod
  def _scatter(indices, values, shape):
    return tf.scatter_nd(tf.expand_dims(indices, 1), values, tf.cast(shape, tf.int32))


@te_api.tf_style_encoding_stage
class TopKStage(_Sparsify):
  """Flat x -> the k largest-magnitude values and their int32 indices."""

  INDICES_KEY = "indices"

  @property
  def name(self):
    return "top_k"

  def encode(self, x, encode_params):
    del encode_params  # Empty.
    indices = tf.math.top_k(tf.abs(x), self._count(x), sorted=False).indices
    return collections.OrderedDict([(self.ENCODED_VALUES_KEY, tf.gather(x, indices)),
                                    (self.INDICES_KEY, indices)])

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
    del decode_params, num_summands  # Unused.
    return self._scatter(encoded_tensors[self.INDICES_KEY],
                         encoded_tensors[self.ENCODED_VALUES_KEY], shape)


def random_indices(n: int, k: int, seed) -> tf.Tensor:
  """int32[k]: k distinct indices of [0, n), uniform, drawn statelessly from `seed` (int32[2])."""
  return tf.math.top_k(tf.random.stateless_uniform([n], seed), k, sorted=False).indices


@te_api.tf_style_encoding_stage
class RandKStage(_Sparsify):
  """Flat x -> k uniformly drawn coordinates' values (times n / k if unbiased) and the seed."""

  SEED_KEY = "seed"

  def __init__(self, fraction: float = 0.01, k: int = 0, unbiased: bool = True, salt=None):
    super().__init__(fraction, k)
    self._unbiased = unbiased
    self._salt = te_api.salt_or_current(salt)

  @property
  def name(self):
    return "random_k"

  def encode(self, x, encode_params):
    del encode_params  # Empty.
    n, k = x.shape[0], self._count(x)
    seed = te_api.noise_seed(x, self._salt)
    values = tf.gather(x, random_indices(n, k, seed))
    if self._unbiased:
      values *= tf.cast(n / k, x.dtype)
    return collections.OrderedDict([(self.ENCODED_VALUES_KEY, values), (self.SEED_KEY, seed)])

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
    del decode_params, num_summands  # Unused.
    values = encoded_tensors[self.ENCODED_VALUES_KEY]
    n = shape[0]
    indices = random_indices(n, values.shape[0], encoded_tensors[self.SEED_KEY])
    return self._scatter(indices, values, shape)
