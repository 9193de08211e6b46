"""PowerSGD's rank-r stage (Vogels, Karimireddy & Jaggi 2019, "PowerSGD: Practical
low-rank gradient compression for distributed optimization", Algorithm 1).

A tensor of two or more dimensions is viewed as the matrix M (n x m) of its
leading dimensions by its last one: a Keras kernel (in, out) as it is, a
convolution kernel (h, w, in, out) as (h * w * in, out), the transpose of
the paper's (out, rest) view of PyTorch's layout, which has the same rank-r
approximations. With a factor Q (m x r), the client computes P = M Q,
orthonormalizes P's columns (Gram-Schmidt: the QR factor whose R has a
non-negative diagonal) to P^, then Q' = M^T P^, and sends P^ (n x r) and Q'
(m x r): (n + m) r floats. The server decodes P^ Q'^T = P^ P^^T M, M
projected onto the span of M Q.

The paper all-reduces P between the two products, so all workers share P^.
fedsim's round has one aggregation step, so each client orthonormalizes its
own P (the per-client variant) and the server decodes each client before
summing. Q is the paper's warm start: the server keeps it and sends it down
with the encoder parameters (m r floats); after the round it is the clients'
Q' summed, scaled to unit Frobenius norm. The paper's Q is their mean: any
invertible r x r factor on Q's right leaves the span of M Q, and so every
decoded value, unchanged; the unit norm only keeps P = M Q in float range.
The first Q is drawn from N(0, 1), seeded by the run seed and the tensor's
index (`noise_seeds.noise_salt`). Without warm start a fresh Q is drawn for
each encoding, seeded by the values (`noise_seeds.noise_seed`), as the
paper's ablation does. Tensors of fewer than two dimensions are sent
unchanged, as the paper sends biases; r is capped at min(n, m), where M is
reproduced exactly.
"""

from __future__ import annotations

import collections
import math

import tensorflow as tf

from fedsim.compression import tensor_encoding_api as te_api


def matrix_shape(shape) -> tuple[int, int]:
  """(n, m): the matrix a tensor of `shape` (two or more dimensions) is viewed as."""
  return math.prod(shape[:-1]), shape[-1]


def orthonormal_columns(p: tf.Tensor) -> tf.Tensor:
  """`p`'s columns orthonormalized in order (Gram-Schmidt's result for full
  column rank): the Q factor of `p`'s QR decomposition, each column's sign set
  so that R's diagonal is non-negative. Householder QR stays orthonormal when
  `p` is rank deficient (an all-zero update), where Gram-Schmidt divides by 0."""
  q, r = tf.linalg.qr(p)
  signs = tf.where(tf.linalg.diag_part(r) < 0, -tf.ones([], p.dtype), tf.ones([], p.dtype))
  return q * signs[tf.newaxis, :]


@te_api.tf_style_adaptive_encoding_stage
class PowerSgdStage(te_api.AdaptiveEncodingStageInterface):
  """x -> P^ [n, r] and Q' [m, r], one power iteration from the factor Q; a
  tensor of fewer than two dimensions -> itself. With `warm_start` the state
  is Q (summed from the clients' Q' each round); without, it is empty."""

  P_KEY = "p"
  Q_KEY = "q"
  VALUES_KEY = "values"   # a tensor of fewer than two dimensions, unchanged
  WARM_START_KEY = "warm_start"

  def __init__(self, rank: int, warm_start: bool, shape, salt=None):
    if rank < 1:
      raise ValueError(f"rank must be >= 1, got {rank}")
    self._shape = tuple(int(d) for d in shape)
    self._low_rank = len(self._shape) >= 2
    if self._low_rank:
      self._n, self._m = matrix_shape(self._shape)
      self._rank = min(rank, self._n, self._m)
    self._warm = warm_start and self._low_rank
    self._salt = te_api.salt_or_current(salt)

  @property
  def name(self):
    return "power_sgd"

  @property
  def compressible_tensors_keys(self):
    return []

  @property
  def commutes_with_sum(self):
    return not self._low_rank

  @property
  def decode_needs_input_shape(self):
    return False

  @property
  def state_update_aggregation_modes(self):
    if not self._warm:
      return {}
    return {self.WARM_START_KEY: te_api.StateAggregationMode.SUM}

  @property
  def UPDATES_IN_ENCODED(self):   # pylint: disable=invalid-name
    """The state update Q' is the encoded Q': the encoded sum sends it once."""
    return {self.WARM_START_KEY: self.Q_KEY} if self._warm else {}

  def initial_state(self):
    if not self._warm:
      return collections.OrderedDict()
    return collections.OrderedDict([(self.WARM_START_KEY, self._random_factor(self._salt))])

  def update_state(self, state, state_update_tensors):
    if not self._warm:
      return collections.OrderedDict()
    summed = state_update_tensors[self.WARM_START_KEY]
    norm = tf.norm(summed)
    # All clients sent 0 (no update): keep the last factor rather than a zero one.
    return collections.OrderedDict([(self.WARM_START_KEY, tf.where(
        norm > 0, tf.math.divide_no_nan(summed, norm), state[self.WARM_START_KEY]))])

  def get_params(self, state):
    if not self._warm:
      return collections.OrderedDict(), collections.OrderedDict()
    return (collections.OrderedDict([(self.WARM_START_KEY, state[self.WARM_START_KEY])]),
            collections.OrderedDict())

  def encode(self, x, encode_params):
    if not self._low_rank:
      return collections.OrderedDict([(self.VALUES_KEY, x)]), collections.OrderedDict()
    matrix = tf.reshape(x, [self._n, self._m])
    if self._warm:
      factor = tf.cast(encode_params[self.WARM_START_KEY], x.dtype)
    else:
      factor = tf.cast(self._random_factor(te_api.noise_seed(x, self._salt)), x.dtype)
    p = orthonormal_columns(tf.matmul(matrix, factor))
    q = tf.matmul(matrix, p, transpose_a=True)
    encoded = collections.OrderedDict([(self.P_KEY, p), (self.Q_KEY, q)])
    updates = collections.OrderedDict([(self.WARM_START_KEY, q)] if self._warm else [])
    return encoded, updates

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
    del decode_params, num_summands, shape  # The shape is the stage's own.
    if not self._low_rank:
      return encoded_tensors[self.VALUES_KEY]
    decoded = tf.matmul(encoded_tensors[self.P_KEY], encoded_tensors[self.Q_KEY],
                        transpose_b=True)
    return tf.reshape(decoded, self._shape)

  def _random_factor(self, seed):
    """Q [m, r] of N(0, 1) values, a stateless draw from `seed` (int32[2])."""
    return tf.random.stateless_normal([self._m, self._rank], tf.cast(seed, tf.int32))
