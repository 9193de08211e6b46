"""Which encoder each tensor of a value gets, and the encoders built here.

A direction's encoder applies to floating-point tensors with at least
`min_elements` elements (or more than `threshold`); every other tensor gets
the identity encoder, since
quantizing a small tensor saves few bits and its error weighs more per
parameter, and the quantizers only handle floats. A registered builder's
result becomes an `Encoder` through `as_encoder`; the built-in `uniform` and
`hadamard` encoders are `quantization_encoder`'s chain.
"""

from __future__ import annotations

import contextvars
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.compression import ENCODERS, DirectionSpec, check
from fedsim.compression import tensor_encoding_api as te_api


def is_encoded(spec: tf.TensorSpec, min_elements: int | None,
               threshold: int | None = None) -> bool:
  """True if a tensor of `spec` gets the direction's encoder, False for identity.

  The tensor must be floating point with at least `min_elements` elements,
  or, when `threshold` is given, more than `threshold` elements.

  Raises:
    ValueError: if the shape of `spec` is not fully known (its size, and so
      the choice, would depend on the value).
  """
  if not spec.shape.is_fully_defined():
    raise ValueError(f"cannot choose an encoder for a tensor of unknown shape {spec.shape}")
  rule = DirectionSpec(None, min_elements, threshold)
  return spec.dtype.is_floating and rule.encodes(int(np.prod(spec.shape.as_list())))


def encoder_for(spec: tf.TensorSpec, direction: DirectionSpec | None) -> te_api.Encoder:
  """The tensor_encoding `Encoder` for a tensor of `spec` in `direction`.

  `direction` None means no compression: the identity encoder.

  Raises:
    ValueError: as `is_encoded`.
    TypeError: if a registered encoder builder returns neither an Encoder nor
      an encoding stage.
  """
  if direction is None or not is_encoded(spec, direction.min_elements, direction.threshold):
    return te_api.identity_encoder()
  check.first_use(direction, spec)   # a plugin's encoder, before a run trusts it
  entry = ENCODERS.get(direction.encoder.name)
  token = _ENCODED_SPEC.set(spec)
  try:
    return as_encoder(entry.build(direction.encoder.params))
  finally:
    _ENCODED_SPEC.reset(token)


def encoder_at(spec: tf.TensorSpec, direction: DirectionSpec | None, seed: int,
               index: int) -> te_api.Encoder:
  """`encoder_for(spec, direction)` for the tensor at flat `index` of a value,
  its random draws salted by (`seed`, `index`) (see `noise_seeds.noise_seed`).

  Every party that encodes a tensor builds its encoder here: the aggregation,
  the broadcast, and a client or server reproducing that encoding for error
  feedback, so they draw the same noise and decode the same bits.
  """
  with te_api.noise_key(seed, index):
    return encoder_for(spec, direction)


_ENCODED_SPEC: contextvars.ContextVar[tf.TensorSpec | None] = contextvars.ContextVar(
    "fedsim_encoded_spec", default=None)


def encoded_spec() -> tf.TensorSpec:
  """The spec of the tensor whose encoder `encoder_for` is building.

  tensor_encoding's `initial_state()` takes no input, so a stage whose state
  is shaped by the tensor (powersgd's warm-start factor) reads the shape here
  when it is built.

  Raises:
    RuntimeError: outside `encoder_for`'s call of a registered builder.
  """
  spec = _ENCODED_SPEC.get()
  if spec is None:
    raise RuntimeError("encoded_spec() is only known while encoder_for builds an encoder")
  return spec


def as_encoder(built: Any) -> te_api.Encoder:
  """`built` as an `Encoder` with its stages' random draws seeded
  (`tensor_encoding_api.seeded`): an Encoder however composed, or a single
  encoding stage.

  Raises:
    TypeError: if `built` is neither.
  """
  if isinstance(built, te_api.Encoder):
    return te_api.seeded(built)
  if isinstance(built, (te_api.EncodingStageInterface, te_api.AdaptiveEncodingStageInterface)):
    return te_api.chain(built)
  raise TypeError("an encoder builder must return a tensor_encoding Encoder or"
                  f" encoding stage, got {type(built).__name__}")


def quantization_encoder(bits: int, stochastic: bool, rotate: bool) -> te_api.Encoder:
  """Flatten, optional randomized Hadamard rotation, uniform quantization, bit packing.

  Quantization maps [min, max] of the (rotated) vector onto 2**bits - 1 equal
  steps; min and max travel with the packed values as two floats. Packing
  writes the values' bits back to back, 28 to an int32 (so that a varint stays
  4 bytes): about bits * 32 / 28 bits per element on the wire.
  The rotation pads the vector with zeros to the next power of two; its signs'
  seed (int32[2], 64 bits) travels with the encoded value. Random draws are
  seeded by `noise_seeds.noise_seed` (the values encoded, salted with the run
  seed and the tensor's index), so encoding is a pure function.
  """
  steps = [te_api.stages.FlattenEncodingStage()]
  if rotate:
    steps.append(te_api.SeededHadamardStage())
  steps.append(te_api.SeededUniformQuantizationStage(bits, stochastic=stochastic))
  steps.append(te_api.stages.BitpackingEncodingStage(bits))
  return te_api.chain(*steps)


def tensor_specs(value_type: tff.Type) -> Any:
  """The nested `tf.TensorSpec`s of an unplaced TFF type, in its Python containers."""
  return tff.types.type_to_tf_tensor_specs(value_type)
