"""Encoded sum: clients encode, the server decodes and sums, and measures what came.

As TFF 0.87's `EncodedSumFactory` (which TFF 0.88 deleted): each client
encodes its value per tensor; whatever decoding does not commute with the
sum runs per client inside `federated_aggregate`'s accumulate, on the server
side; the rest runs once after the sum. Unlike TFF's, the accumulate also
measures each client's encoded value before decoding it (`wire_meter`: the
bits of its packed symbols, what an entropy coder would send for them, the
bits of value-dependent shapes) into a server-only part of the accumulator,
reported as the measurement `wire`. Nothing extra crosses the wire: the
clients' `work` output is the encoded value alone, so sizing the compiled
round sizes the same upload.

A state update that copies an encoded tensor (powersgd's Q', see
`updates_in_encoded`) is sent once: the server reads it from the encoded value.

The state also counts the rounds this sum has run; with `round_noise`, the
count goes to the clients with the encoder parameters (an int32: 32 bits
down) and is folded into their noise (`noise_seeds.noise_round`).
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Callable

import tensorflow as tf
import tensorflow_federated as tff

from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression import wire_meter

# The name of the round counter among the encoder parameters sent down.
NOISE_ROUND_KEY = "noise_round"
_COMBINE = {"SUM": tf.add, "MIN": tf.minimum, "MAX": tf.maximum}


def _state_combiners(encoders) -> list[Callable]:
  """How each encoder's state-update tensors combine over clients (tensor_encoding's modes)."""
  out = []
  for encoder in encoders:
    for mode in encoder.state_update_aggregation_modes:
      name = getattr(mode, "name", str(mode)).upper()
      if name not in _COMBINE:
        raise ValueError(f"state aggregation mode {name} is not supported")
      out.append(_COMBINE[name])
  return out


def updates_in_encoded(encoder) -> dict[int, str]:
  """{flat index among `encoder`'s state updates: key of the encoded tensor it
  copies}, read from a childless stage's `UPDATES_IN_ENCODED` ({update key:
  encoded key}); {} when there is none."""
  copies = dict(getattr(encoder.stage, "UPDATES_IN_ENCODED", None) or {})
  if not copies or encoder.children:
    return {}
  # A childless encoder's updates are its stage's, flattened in key order.
  return {i: te_api.ROOT_TENSORS_PREFIX + copies[key] for i, key in enumerate(sorted(copies))}


def _sent_updates(updates, copies: dict[int, str]) -> list:
  """The state updates a client sends: those its encoded value does not carry."""
  return [u for i, u in enumerate(updates) if i not in copies]


def _all_updates(sent, encoded, copies: dict[int, str], count: int) -> list:
  """The client's state updates, the copies taken back from its encoded value."""
  sent = iter(sent)
  return [encoded[copies[i]] if i in copies else next(sent) for i in range(count)]


class EncodedSumFactory(tff.aggregators.UnweightedAggregationFactory):
  """An `UnweightedAggregationFactory` for the sum of client values, encoded per tensor.

  `encoder_fn(spec, index)` returns the tensor_encoding `Encoder` for the
  tensor of `spec` at flat (`tf.nest`) `index` of the value. The process's
  state is `{'encoders': the encoders' states, 'round': rounds run}`; its
  measurements are `{'wire': {KEYS}}` (see `wire_meter`), summed over the
  aggregated clients (`max_client_bits`: the largest client's). `round_noise`:
  clients fold the round into their noise (off for error feedback, whose
  clients re-encode without knowing it). `lossless`: the packed symbols are
  counted at their Huffman code's size (`wire_meter`'s `coded_bits`).
  """

  def __init__(self, encoder_fn: Callable[[tf.TensorSpec, int], Any], round_noise: bool = True,
               lossless: bool = False):
    self._encoder_fn = encoder_fn
    self._round_noise = round_noise
    self._lossless = lossless

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs = tff.types.type_to_tf_tensor_specs(value_type)
    flat_specs = tf.nest.flatten(specs)
    built = [self._encoder_fn(s, i) for i, s in enumerate(flat_specs)]
    encoders = [te_api.gather_encoder(e, s) for e, s in zip(built, flat_specs)]
    meters = [wire_meter.WireMeter.of(e, s, self._lossless) for e, s in zip(built, flat_specs)]
    combiners = _state_combiners(encoders)
    copies = [updates_in_encoded(e) for e in built]
    counts = [len(tf.nest.flatten(e.state_update_aggregation_modes)) for e in encoders]
    round_noise = self._round_noise

    @tff.tensorflow.computation
    def initial_state():
      return collections.OrderedDict(encoders=[e.initial_state() for e in encoders],
                                     round=tf.constant(0, tf.int32))

    @tff.federated_computation
    def init_fn():
      return tff.federated_eval(initial_state, tff.SERVER)

    state_type = init_fn.type_signature.result.member

    @tff.tensorflow.computation(state_type)
    def get_params(state):
      # Seeded draws in get_params (a rotation's seed) fold in the round too: a
      # MapReduceForm computes these twice, in `prepare` and in `update`.
      with (te_api.noise_round(state["round"]) if round_noise else contextlib.nullcontext()):
        params = [e.get_params(s) for e, s in zip(encoders, state["encoders"])]
      encode_params = collections.OrderedDict(
          [("encoders", [p[0] for p in params]),
           (NOISE_ROUND_KEY, state["round"] if round_noise else ())])
      return encode_params, [p[1] for p in params], [p[2] for p in params]

    encode_params_type, before_sum_type, after_sum_type = get_params.type_signature.result

    # Clients send the before-sum decode parameters back with their encoded
    # value (as TFF's does): a server value cannot reach `accumulate` otherwise.
    @tff.tensorflow.computation(value_type, encode_params_type, before_sum_type)
    def encode(value, encode_params, before_sum_params):
      params, round_index = encode_params["encoders"], encode_params[NOISE_ROUND_KEY]
      with (te_api.noise_round(round_index) if round_noise else contextlib.nullcontext()):
        pairs = [e.encode(x, p) for e, x, p in zip(encoders, tf.nest.flatten(value), params)]
      return ([p[0] for p in pairs], before_sum_params,
              [_sent_updates(p[1], c) for p, c in zip(pairs, copies)])

    encoded_type = encode.type_signature.result

    def all_updates(encoded, sent):
      return [_all_updates(s, x, c, n) for s, x, c, n in zip(sent, encoded, copies, counts)]

    def decode_before_sum(encoded, params):
      return [e.decode_before_sum(x, p) for e, x, p in zip(encoders, encoded, params)]

    @tff.tensorflow.computation(encoded_type[0], encoded_type[1])
    def part_decoded_shape(encoded, params):
      return decode_before_sum(encoded, params)

    @tff.tensorflow.computation(encoded_type[0], encoded_type[2])
    def updates_shape(encoded, sent):
      return all_updates(encoded, sent)

    part_type = part_decoded_shape.type_signature.result
    updates_type = updates_shape.type_signature.result

    def zeros_of(type_spec):
      return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype),
                                   tff.types.type_to_tf_tensor_specs(type_spec))

    def accumulator(values, count, updates, wire):
      return collections.OrderedDict(values=values, count=count, updates=updates, wire=wire)

    @tff.tensorflow.computation
    def zero():
      return accumulator(zeros_of(part_type), tf.constant(0, tf.int32), zeros_of(updates_type),
                         wire_meter.zeros())

    acc_type = zero.type_signature.result

    def combine_updates(a, b):
      flat = [f(x, y) for f, x, y in zip(combiners, tf.nest.flatten(a), tf.nest.flatten(b))]
      return tf.nest.pack_sequence_as(a, flat)

    @tff.tensorflow.computation(acc_type, encoded_type)
    def accumulate(acc, client):
      encoded, params, updates = client
      wire = wire_meter.add(acc["wire"], wire_meter.measure_value(meters, encoded))
      values = tf.nest.map_structure(tf.add, acc["values"], decode_before_sum(encoded, params))
      return accumulator(values, acc["count"] + 1,
                         combine_updates(acc["updates"], all_updates(encoded, updates)), wire)

    @tff.tensorflow.computation(acc_type, acc_type)
    def merge(a, b):
      return accumulator(tf.nest.map_structure(tf.add, a["values"], b["values"]),
                         a["count"] + b["count"], combine_updates(a["updates"], b["updates"]),
                         wire_meter.add(a["wire"], b["wire"]))

    @tff.tensorflow.computation(acc_type)
    def report(acc):
      return acc

    @tff.tensorflow.computation(part_type, tf.int32, after_sum_type)
    def decode_after_sum(summed, count, params):
      flat = [e.decode_after_sum(x, p, tf.reshape(count, [1]))
              for e, x, p in zip(encoders, summed, params)]
      return tf.nest.pack_sequence_as(specs, flat)

    @tff.tensorflow.computation(state_type, updates_type)
    def update_state(state, updates):
      return collections.OrderedDict(
          encoders=[e.update_state(s, u) for e, s, u in zip(encoders, state["encoders"], updates)],
          round=state["round"] + 1)

    @tff.tensorflow.computation(acc_type)
    def measurements_of(acc):
      return collections.OrderedDict(wire=acc["wire"])

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      encode_params, before_sum_params, after_sum_params = tff.federated_map(get_params, state)
      encoded = tff.federated_map(encode, (value, tff.federated_broadcast(encode_params),
                                           tff.federated_broadcast(before_sum_params)))
      summed = tff.federated_aggregate(encoded, zero(), accumulate, merge, report)
      result = tff.federated_map(decode_after_sum,
                                 (summed.values, summed.count, after_sum_params))
      new_state = tff.federated_map(update_state, (state, summed.updates))
      return tff.templates.MeasuredProcessOutput(
          state=new_state, result=result,
          measurements=tff.federated_map(measurements_of, summed))

    return tff.templates.AggregationProcess(init_fn, next_fn)
