"""fedsim's one doorway to tensor_encoding and TFF's encoding APIs.

tensor_encoding lives under tfmot's `internal` package and TFF 0.88 deleted
both `tff.aggregators.EncodedSumFactory` and the tfmot dependency, so every
use of either is kept in this module: an upgrade rewrites this file only.

User encoders (see `fedsim.compression.register_encoder`) may use the names
re-exported here: `stages` (built-in encoding stages), `EncodingStageInterface`
and `tf_style_encoding_stage` (to write a stage), `Encoder` and `chain`.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_model_optimization.python.core.internal import tensor_encoding as te

Encoder = te.core.Encoder
EncodingStageInterface = te.core.EncodingStageInterface
AdaptiveEncodingStageInterface = te.core.AdaptiveEncodingStageInterface
tf_style_encoding_stage = te.core.tf_style_encoding_stage
stages = te.stages

_STAGE_TYPES = (EncodingStageInterface, AdaptiveEncodingStageInterface)


def chain(*encoding_stages: Any) -> Encoder:
  """An `Encoder` applying `encoding_stages` in order, each to its parent's output.

  Every stage but the last must have exactly one compressible output (e.g.
  flatten -> rotate -> quantize -> bitpack); the next stage encodes that one.

  Raises:
    ValueError: if no stage is given or a non-final stage has zero or several
      compressible outputs.
  """
  if not encoding_stages:
    raise ValueError("chain() needs at least one encoding stage")
  composer = te.core.EncoderComposer(encoding_stages[-1])
  for parent in reversed(encoding_stages[:-1]):
    keys = list(parent.compressible_tensors_keys)
    if len(keys) != 1:
      raise ValueError(f"stage '{parent.name}' has compressible outputs {keys};"
                       " only a stage with exactly one can be chained")
    composer = composer.add_parent(parent, keys[0])
  return composer.make()


def identity_encoder() -> Encoder:
  """An `Encoder` that sends the tensor unchanged."""
  return te.encoders.identity()


def quantization_encoder(bits: int, stochastic: bool, rotate: bool) -> Encoder:
  """Flatten, optional randomized Hadamard rotation, uniform quantization, bit packing.

  Quantization maps [min, max] of the (rotated) vector onto 2**bits - 1 equal
  steps; min and max travel with the packed values as two floats. Packing
  writes the values' bits back to back, 28 to an int32 (so that a varint stays
  4 bytes): about bits * 32 / 28 bits per element on the wire.
  The rotation pads the vector with zeros to the next power of two.
  """
  steps = [stages.FlattenEncodingStage()]
  if rotate:
    steps.append(stages.HadamardEncodingStage())
  steps.append(stages.UniformQuantizationEncodingStage(bits, stochastic=stochastic))
  steps.append(stages.BitpackingEncodingStage(bits))
  return chain(*steps)


def as_encoder(built: Any) -> Encoder:
  """`built` as an `Encoder`: an Encoder is kept, a single encoding stage is wrapped.

  Raises:
    TypeError: if `built` is neither.
  """
  if isinstance(built, Encoder):
    return built
  if isinstance(built, _STAGE_TYPES):
    return te.core.EncoderComposer(built).make()
  raise TypeError("an encoder builder must return a tensor_encoding Encoder or"
                  f" encoding stage, got {type(built).__name__}")


def simple_encoder(encoder: Encoder, spec: tf.TensorSpec) -> te.core.SimpleEncoder:
  """`encoder` bound to one tensor spec for one-to-many use (server -> clients)."""
  return te.encoders.as_simple_encoder(encoder, spec)


def gather_encoder(encoder: Encoder, spec: tf.TensorSpec) -> te.core.GatherEncoder:
  """`encoder` bound to one tensor spec for many-to-one use (clients -> server)."""
  return te.encoders.as_gather_encoder(encoder, spec)


def encoded_sum_factory(
    encoder_fn: Callable[[tf.TensorSpec], te.core.GatherEncoder],
) -> tff.aggregators.UnweightedAggregationFactory:
  """TFF's encoded sum: clients encode, the server decodes and sums.

  Whatever of the decoding commutes with sum runs after the sum on the server;
  the rest runs per client inside `federated_aggregate`'s accumulate, so the
  clients' `work` output is the encoded form.
  """
  return tff.aggregators.EncodedSumFactory(encoder_fn)
