"""The encoder of docs/guides/own-encoder.md: stochastic 1-bit sign quantization.

Each coordinate x_i of a tensor with scale M = max|x| is sent as one bit b_i,
1 with probability (1 + x_i / M) / 2, and decoded as M (2 b_i - 1): unbiased,
E||x^ - x||^2 = n M^2 - ||x||^2. Load it with `plugins: [./own_encoder.py]`
and name it `encoder: stochastic_sign`; `fedsim check encoder stochastic_sign
--plugin experiments/plugin_example/own_encoder.py` checks it.
"""

import collections
import functools

from fedsim.compression import register_encoder


@functools.cache
def stochastic_sign_stage() -> type:
  """The stage class, defined on first use: TensorFlow loads when a run builds
  the encoder, not when fedsim imports the plugin (`fedsim validate` stays fast)."""
  import tensorflow as tf
  from fedsim.compression import tensor_encoding_api as te

  @te.tf_style_encoding_stage
  class StochasticSignStage(te.EncodingStageInterface):
    """x -> (bits in {0, 1}, max|x|); decodes max|x| (2 bits - 1)."""

    def __init__(self):
      # The salt of the tensor this stage is built for (run seed, tensor index).
      self._salt = te.salt_or_current(None)

    name = "stochastic_sign"
    compressible_tensors_keys = ["bits"]   # bit packing encodes these next
    commutes_with_sum = False              # each client has its own scale
    decode_needs_input_shape = False

    def get_params(self):
      return collections.OrderedDict(), collections.OrderedDict()

    def encode(self, x, encode_params):
      del encode_params
      scale = tf.reduce_max(tf.abs(x))
      up = (1.0 + tf.math.divide_no_nan(x, scale)) / 2.0
      noise = tf.random.stateless_uniform(tf.shape(x), te.noise_seed(x, self._salt))
      return collections.OrderedDict(bits=tf.cast(noise < up, x.dtype), scale=scale)

    def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
      del decode_params, num_summands, shape
      return encoded_tensors["scale"] * (2.0 * encoded_tensors["bits"] - 1.0)

  return StochasticSignStage


@register_encoder("stochastic_sign")
def stochastic_sign(params):
  """Stochastic 1-bit sign quantization scaled by max|x| (unbiased), bit-packed."""
  del params
  from fedsim.compression import tensor_encoding_api as te
  return te.chain(te.stages.FlattenEncodingStage(), stochastic_sign_stage()(),
                  te.stages.BitpackingEncodingStage(1))
