"""An encoder plugin, one file: a stage and its registration.

`fixed_grid` sends each coordinate as the index of the nearest of 2**bits
evenly spaced points on [-limit, limit] (values outside are clipped first),
bit-packed: ceil(n * bits / 28) int32 per tensor of n elements and nothing
else, since the grid is fixed in the config. Deterministic, so it draws no
noise. Named in a config as `encoder: fixed_grid` after `plugins: [toy_encoder.py]`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

from fedsim.compression import register_encoder
from fedsim.config.typed import bounded


@dataclasses.dataclass(frozen=True)
class FixedGridParams:
  bits: int = bounded(4, min=1, max=16)
  limit: float = bounded(1.0, gt=0.0)   # the grid spans [-limit, limit]


@functools.cache
def fixed_grid_stage() -> type:
  """The stage class, defined on first use: TensorFlow loads when a run builds
  the encoder, not when fedsim imports the plugin."""
  import tensorflow as tf
  from fedsim.compression import tensor_encoding_api as te

  @te.tf_style_encoding_stage
  class FixedGridStage(te.EncodingStageInterface):
    """x -> round((clip(x) + limit) / step), step = 2 limit / (2**bits - 1)."""

    def __init__(self, bits: int, limit: float):
      self._step = 2.0 * limit / (2**bits - 1)
      self._limit = limit

    name = "fixed_grid"
    compressible_tensors_keys = ["indices"]   # bit packing encodes these next
    commutes_with_sum = False
    decode_needs_input_shape = False

    def get_params(self):
      return collections.OrderedDict(), collections.OrderedDict()

    def encode(self, x, encode_params):
      del encode_params
      clipped = tf.clip_by_value(x, -self._limit, self._limit)
      return collections.OrderedDict(indices=tf.round((clipped + self._limit) / self._step))

    def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
      del decode_params, num_summands, shape
      return encoded_tensors["indices"] * self._step - self._limit

  return FixedGridStage


@register_encoder("fixed_grid", params=FixedGridParams)
def fixed_grid(params: FixedGridParams):
  """Nearest of 2**bits points on [-limit, limit], bit-packed (a plugin's encoder)."""
  from fedsim.compression import tensor_encoding_api as te
  return te.chain(te.stages.FlattenEncodingStage(),
                  fixed_grid_stage()(params.bits, params.limit),
                  te.stages.BitpackingEncodingStage(params.bits))
