"""EDEN's quantizer (Vargaftik et al. 2022, "EDEN: Communication-efficient and
robust distributed mean estimation for federated learning").

After a random rotation y = R x of d coordinates (d: the padded length), the
coordinates of eta * y, eta = sqrt(d) / ||y||_2, are close to N(0, 1). Each is
rounded to the nearest of the 2^b Lloyd-Max centroids c_k of the standard
normal (deterministic), giving Q = (c_k of each coordinate); the client sends
the b-bit indices and the one scale

    S = ||y||_2^2 / <y, Q>,

and the server decodes R^-1 (S Q). With a uniformly random rotation the
estimate is unbiased (the scale makes <y, S Q> = ||y||^2); for b = 1 the
centroids are +-sqrt(2 / pi) and EDEN is DRIVE with its unbiased scale. The
rotation is fedsim's seeded randomized Hadamard transform (as `drive`).
"""

from __future__ import annotations

import collections
import functools
import math

import numpy as np
import tensorflow as tf

from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.stages.base import PerClientStage


def _normal_pdf(t: float) -> float:
  return math.exp(-t * t / 2) / math.sqrt(2 * math.pi) if math.isfinite(t) else 0.0


def _normal_cdf(t: float) -> float:
  return 0.5 * (1 + math.erf(t / math.sqrt(2))) if math.isfinite(t) else float(t > 0)


@functools.lru_cache(maxsize=None)
def normal_centroids(bits: int, iterations: int = 2000) -> tuple[float, ...]:
  """The 2^bits Lloyd-Max centroids of N(0, 1), ascending (Lloyd's iteration:
  boundaries at midpoints, centroids at the conditional means between them)."""
  count = 2**bits
  # Start from the quantiles' midpoints: symmetric, ascending, in every cell.
  centroids = [math.sqrt(2) * _inverse_erf(2 * (k + 0.5) / count - 1) for k in range(count)]
  for _ in range(iterations):
    edges = [-math.inf] + [(a + b) / 2 for a, b in zip(centroids, centroids[1:])] + [math.inf]
    previous, centroids = centroids, [
        (_normal_pdf(lo) - _normal_pdf(hi)) / (_normal_cdf(hi) - _normal_cdf(lo))
        for lo, hi in zip(edges, edges[1:])]
    if max(abs(a - b) for a, b in zip(previous, centroids)) < 1e-13:
      break
  return tuple(centroids)


def _inverse_erf(y: float) -> float:
  """erf^-1(y) for |y| < 1 by bisection (only seeds Lloyd's iteration)."""
  lo, hi = -6.0, 6.0
  for _ in range(100):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
  return (lo + hi) / 2


@te_api.tf_style_encoding_stage
class EdenStage(PerClientStage):
  """Rotated flat y -> b-bit Lloyd-Max indices of sqrt(d) y / ||y|| (as y's dtype) and S."""

  ENCODED_VALUES_KEY = "symbols"
  SCALE_KEY = "scale"

  def __init__(self, bits: int = 1):
    if bits < 1:
      raise ValueError(f"bits must be >= 1, got {bits}")
    self._bits = bits
    self._centroids = np.asarray(normal_centroids(bits), np.float64)

  @property
  def name(self):
    return f"eden_{self._bits}"

  def encode(self, x, encode_params):
    del encode_params  # Empty.
    d = tf.cast(tf.size(x), x.dtype)
    eta = tf.math.divide_no_nan(tf.sqrt(d), tf.norm(x))
    edges = ((self._centroids[1:] + self._centroids[:-1]) / 2).tolist()
    index = tf.raw_ops.Bucketize(input=x * eta, boundaries=edges)
    quantized = tf.gather(tf.constant(self._centroids, x.dtype), index)
    scale = tf.math.divide_no_nan(tf.reduce_sum(tf.square(x)), tf.reduce_sum(x * quantized))
    return collections.OrderedDict([(self.ENCODED_VALUES_KEY, tf.cast(index, x.dtype)),
                                    (self.SCALE_KEY, scale)])

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
    del decode_params, num_summands, shape  # Unused.
    symbols = encoded_tensors[self.ENCODED_VALUES_KEY]
    centroids = tf.constant(self._centroids, symbols.dtype)
    return tf.gather(centroids, tf.cast(symbols, tf.int32)) * encoded_tensors[self.SCALE_KEY]
