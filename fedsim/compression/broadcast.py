"""Encoded broadcast: the server encodes, the encoded form is broadcast, clients decode.

What `federated_broadcast` carries is the encoded structure (for quantization:
bit-packed int32 plus min/max per tensor, and the encoder's decode parameters
such as the Hadamard seed), so a compiled MapReduceForm's `prepare` result
shows the encoded size. The server, which encodes, also measures what it
sends (measurement `wire`, see `fedsim.compression.wire_meter`): the same
for every client.

With `error_feedback: true` the server keeps what its encoder dropped and
adds it to the next model it sends (`fedsim.compression.feedback`); the
residual is part of the process's server state, so it is checkpointed and
resumed with it.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_federated as tff

from fedsim.compression import DirectionSpec, feedback, wire_meter
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.encoders import encoder_at, tensor_specs


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
      round: a counter of `next` calls in the state, the tensor's flat index,
      the values encoded): see `noise_seeds.noise_seed`.

  Returns:
    A process whose state@SERVER is `{'encoders': the encoders' states (empty
    tuples for stateless encoders), 'round': int32 count of broadcasts}` and,
    with `spec.error_feedback`, `'residual'`: one float tensor per tensor of
    the value; whose
    `next(state, value@SERVER)` returns `value` (plus the residual) decoded
    @CLIENTS, with the container types of `weights_type`, and measurements
    `{'wire': {KEYS}}` of one client's copy (see `wire_meter`), plus
    `{'error_feedback': {'residual_norm'}}` (L2, after this round) with
    error feedback.

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
    encoder = encoder_at(tensor_spec, spec, seed, index)
    encoders.append(te_api.simple_encoder(encoder, tensor_spec))
    meters.append(wire_meter.WireMeter.of(encoder, tensor_spec,
                                          spec is not None and spec.lossless == "huffman"))

  keeps_residual = spec is not None and spec.error_feedback

  @tff.tensorflow.computation
  def initial_state():
    state = {"encoders": [e.initial_state() for e in encoders],
             "round": tf.constant(0, tf.int32)}
    if keeps_residual:
      state["residual"] = feedback.initial_server_residual(flat_specs)
    return state

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(initial_state, tff.SERVER)

  state_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type, weights_type)
  def encode(state, value):
    flat = tf.nest.flatten(value)
    if keeps_residual:
      flat = feedback.add_residual(flat, state["residual"])
    with te_api.noise_round(state["round"]):
      pairs = [e.encode(x, s) for e, x, s in zip(encoders, flat, state["encoders"])]
    wire = wire_meter.measure_value(meters, [p[0] for p in pairs])
    new_state = {"encoders": [tuple(p[1]) for p in pairs], "round": state["round"] + 1}
    measurements = {"wire": wire}
    if keeps_residual:
      new_state["residual"], measurements[feedback.MEASUREMENT] = feedback.server_residual(
          flat, [e.decode(p[0]) for e, p in zip(encoders, pairs)])
    return [p[0] for p in pairs], new_state, measurements

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
