"""Encoded broadcast: the server encodes, the encoded form is broadcast, clients decode.

What `federated_broadcast` carries is the encoded structure (for quantization:
bit-packed int32 plus min/max per tensor, and the encoder's decode parameters
such as the Hadamard seed), so a compiled MapReduceForm's `prepare` result
shows the encoded size. The server, which encodes, also measures what it
sends (measurement `wire`, see `fedsim.compression.wire_meter`): the same
for every client.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_federated as tff

from fedsim.compression import DirectionSpec
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression import wire_meter
from fedsim.compression.encoders import encoder_for, tensor_specs


def build_encoded_broadcast(
    weights_type: tff.Type, spec: DirectionSpec | None, seed: int = 0,
) -> tff.learning.templates.DistributionProcess:
  """A DistributionProcess that sends `weights_type` values encoded per `spec`.

  Args:
    weights_type: unplaced TFF type of the server value to broadcast, e.g. a
      `tff.learning.models.ModelWeights` of float32 tensors; any nested struct
      of fully-shaped tensors.
    spec: the broadcast direction; None sends every tensor unchanged (still
      through this process).
    seed: the run seed; the encoders' random draws are seeded by (seed, the
      tensor's flat index, the values encoded): see
      `tensor_encoding_api.noise_seed`.

  Returns:
    A process whose state@SERVER holds the encoders' state (a struct of empty
    tuples for stateless encoders) and whose `next(state, value@SERVER)`
    returns `value` decoded @CLIENTS, with the container types of
    `weights_type`, and measurements `{'wire': {KEYS}}` of one client's copy
    (see `wire_meter`).

  Raises:
    TypeError: if `weights_type` holds federated types or a tensor of unknown
      shape.
  """
  weights_type = tff.types.to_type(weights_type)
  if tff.types.contains(weights_type, lambda t: isinstance(t, tff.FederatedType)):
    raise TypeError(f"weights_type must be unplaced, got {weights_type}")
  specs = tensor_specs(weights_type)
  flat_specs = tf.nest.flatten(specs)
  if not all(s.shape.is_fully_defined() for s in flat_specs):
    raise TypeError(f"every tensor of weights_type needs a known shape, got {weights_type}")
  encoders, meters = [], []
  for index, tensor_spec in enumerate(flat_specs):
    with te_api.noise_key(seed, index):
      encoder = encoder_for(tensor_spec, spec)
    encoders.append(te_api.simple_encoder(encoder, tensor_spec))
    meters.append(wire_meter.WireMeter.of(encoder, tensor_spec))

  @tff.tensorflow.computation
  def initial_state():
    return [e.initial_state() for e in encoders]

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(initial_state, tff.SERVER)

  state_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type, weights_type)
  def encode(state, value):
    pairs = [e.encode(x, s) for e, x, s in zip(encoders, tf.nest.flatten(value), state)]
    wire = wire_meter.zeros()
    for meter, (encoded, _) in zip(meters, pairs):
      wire = wire_meter.add(wire, meter.measure(encoded))
    return [p[0] for p in pairs], [tuple(p[1]) for p in pairs], {"wire": wire}

  @tff.tensorflow.computation(encode.type_signature.result[0])
  def decode(encoded):
    flat = [e.decode(x) for e, x in zip(encoders, encoded)]
    return tf.nest.pack_sequence_as(specs, flat)

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(weights_type, tff.SERVER))
  def next_fn(state, value):
    encoded, new_state, measurements = tff.federated_map(encode, (state, value))
    decoded = tff.federated_map(decode, tff.federated_broadcast(encoded))
    return tff.templates.MeasuredProcessOutput(
        state=new_state, result=decoded, measurements=measurements)

  return tff.learning.templates.DistributionProcess(init_fn, next_fn)
