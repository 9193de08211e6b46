"""A researcher's own pieces for fedsim, loaded by `plugins: [./lab_plugin.py]`.

It registers one of each kind the lab_example.yaml config next to it uses:
a Keras model (dropout, and a softmax output as TFF's compression tutorial
CNN has: fedsim trains on the logits before it), an encoder (round-to-nearest
quantization), and an aggregation stage built from a TFF aggregator factory;
and a second encoder chaining TFF's randomized Hadamard rotation before it.
TensorFlow is imported inside the builders, so `fedsim validate` stays fast.
"""

import dataclasses

from fedsim.aggregation import StageContext, register_aggregation_stage
from fedsim.compression import register_encoder
from fedsim.config.typed import bounded
from fedsim.models import register_model


@dataclasses.dataclass(frozen=True)
class DropoutMlpParams:
  width: int = bounded(64, min=1)
  dropout: float = bounded(0.2, min=0, max=1)


@register_model("dropout_mlp", params=DropoutMlpParams)
def dropout_mlp(params: DropoutMlpParams, input_shape, num_classes):
  """Dense + dropout, ending in softmax probabilities (fedsim trains on the logits)."""
  import tensorflow as tf
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=tuple(input_shape)),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(params.width, activation="relu"),
      tf.keras.layers.Dropout(params.dropout),
      tf.keras.layers.Dense(num_classes, activation="softmax"),
  ])


@dataclasses.dataclass(frozen=True)
class NearestParams:
  bits: int = bounded(4, min=1, max=16)


@register_encoder("uniform_nearest", params=NearestParams)
def uniform_nearest(params: NearestParams):
  """Uniform quantization with round-to-nearest (biased, at most half a step of error)."""
  from fedsim.compression import tensor_encoding_api as te
  return te.chain(te.stages.FlattenEncodingStage(),
                  te.stages.UniformQuantizationEncodingStage(params.bits, stochastic=False),
                  te.stages.BitpackingEncodingStage(params.bits))


@register_encoder("hadamard_nearest", params=NearestParams)
def hadamard_nearest(params: NearestParams):
  """Randomized Hadamard rotation, then round-to-nearest quantization (TFF's stages).

  The rotation's random seed is drawn by fedsim from the run seed and the
  round, the same for every client and for the server's decode.
  """
  from fedsim.compression import tensor_encoding_api as te
  return te.chain(te.stages.FlattenEncodingStage(), te.stages.HadamardEncodingStage(),
                  te.stages.UniformQuantizationEncodingStage(params.bits, stochastic=False),
                  te.stages.BitpackingEncodingStage(params.bits))


@dataclasses.dataclass(frozen=True)
class L1ZeroingParams:
  max_norm: float = bounded(gt=0)


@register_aggregation_stage("l1_zeroing", L1ZeroingParams, inner_key="zeroing")
def l1_zeroing(params: L1ZeroingParams, inner, context: StageContext):
  """Zeroes an update whose L1 norm exceeds max_norm (TFF's zeroing_factory)."""
  import tensorflow_federated as tff
  return tff.aggregators.zeroing_factory(params.max_norm, inner, norm_order=1.0)
