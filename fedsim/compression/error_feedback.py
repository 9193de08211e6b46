"""Error feedback on the upload (Seide et al. 2014; Karimireddy et al. 2019, EF-SGD).

Each client keeps a residual e (what its encoder dropped). When sampled it
sends C(u + e) and keeps e <- (u + e) - C(u + e). fedsim's encoders are pure
functions of the values encoded, the run seed and the tensor's flat index
(`noise_seeds.noise_seed`), so a client can compute C(u + e) itself
with the encoder the aggregation will use and hand u + e to the aggregation,
which encodes it to the very same bits. No encoded value crosses the wire
twice; the residual never leaves the client.

An encoder with state (powersgd's warm-start factor) is a function of the
server's state too. The client then keeps a copy of that state, sent down
with the model and updated from the same sum of the clients' state updates
(`initial_encoder_states`, `updated_encoder_states`; the error-feedback
wrapper carries it as its shared value): that copy crosses the wire besides
the aggregation's own, once each way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from fedsim.compression import DirectionSpec, upload_feedback  # noqa: F401  (re-exported)
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.encoders import encoder_for


def _gather_encoder(tensor_spec: tf.TensorSpec, spec: DirectionSpec, seed: int, index: int):
  """The encoder of the tensor at flat `index`, built as `mean.build_encoded_sum` builds it."""
  with te_api.noise_key(seed, index):
    return te_api.gather_encoder(encoder_for(tensor_spec, spec), tensor_spec)


def _decode_one(x: tf.Tensor, spec: DirectionSpec, seed: int, index: int,
                state: Any = None) -> tuple[tf.Tensor, Any]:
  """(C(x), the encoder's state updates) for the tensor at flat `index`, encoded
  from `state` (None: the encoder's initial state)."""
  encoder = _gather_encoder(tf.TensorSpec(x.shape, x.dtype), spec, seed, index)
  encode_params, before_sum_params, after_sum_params = encoder.get_params(
      encoder.initial_state() if state is None else state)
  encoded, updates = encoder.encode(x, encode_params)
  part = encoder.decode_before_sum(encoded, before_sum_params)
  return encoder.decode_after_sum(part, after_sum_params, 1), updates


def local_decode(value: Any, spec: DirectionSpec | None, seed: int, states: Any = None) -> Any:
  """C(value): what the server decodes from this client's encoded `value`.

  Call inside a TensorFlow computation. Tensors are indexed in `tf.nest`
  order, as TFF's encoded sum indexes them. An encoder whose state changes
  between rounds (powersgd's warm start) needs `states`, the server's current
  states (see `initial_encoder_states`); without them the initial ones are used.

  Args:
    value: a structure of float tensors (the value the aggregation encodes).
    spec: the `encode` stage's direction; None decodes to `value` itself.
    seed: the run seed (`StageContext.seed`).
    states: one encoder state per tensor of `value`, or None.

  Returns:
    The decoded structure, same shapes and dtypes.
  """
  return _local_encode(value, spec, seed, states)[0]


def _local_encode(value: Any, spec: DirectionSpec | None, seed: int,
                  states: Any = None) -> tuple[Any, list]:
  """(C(value), per tensor the encoder's state updates)."""
  if spec is None:
    return value, []
  flat = tf.nest.flatten(value)
  states = [None] * len(flat) if states is None else list(states)
  pairs = [_decode_one(x, spec, seed, i, s) for i, (x, s) in enumerate(zip(flat, states))]
  return (tf.nest.pack_sequence_as(value, [p[0] for p in pairs]),
          [tuple(p[1]) for p in pairs])


def initial_encoder_states(specs: list[tf.TensorSpec], spec: DirectionSpec,
                           seed: int) -> list | None:
  """The initial state of each tensor's encoder (NumPy), for a client to keep a
  copy of the server's, or None when every encoder is stateless.

  Raises:
    ValueError: if a state combines over clients other than by a sum.
  """
  raw = [encoder_for(s, spec) for s in specs]   # cheap: nothing traced
  if not any(tf.nest.flatten(e.state_update_aggregation_modes) for e in raw):
    return None
  encoders = [_gather_encoder(s, spec, seed, i) for i, s in enumerate(specs)]
  for encoder in encoders:
    modes = [getattr(m, "name", str(m)) for m in encoder.state_update_aggregation_modes]
    if any(m != "SUM" for m in modes):
      raise ValueError(f"a client can only follow encoder states updated by a sum, got {modes}")
  return [tuple(np.asarray(t) for t in e.initial_state()) for e in encoders]


def updated_encoder_states(states: Any, summed_updates: Any, specs: list[tf.TensorSpec],
                           spec: DirectionSpec, seed: int) -> list:
  """The encoders' states after a round whose clients' state updates sum to
  `summed_updates`, as the encoded sum updates the server's (TensorFlow)."""
  return [tuple(_gather_encoder(s, spec, seed, i).update_state(state, updates))
          for i, (s, state, updates) in enumerate(zip(specs, states, summed_updates))]


def feedback_step(update: Any, residual: Any, spec: DirectionSpec | None,
                  seed: int) -> tuple[Any, Any, Any]:
  """One client's error-feedback step (TensorFlow).

  Returns:
    (sent, decoded, new_residual): sent = update + residual, the value to
    hand to the aggregation; decoded = C(sent), what the server will decode;
    new_residual = sent - decoded.
  """
  sent = tf.nest.map_structure(tf.add, update, residual)
  decoded = local_decode(sent, spec, seed)
  return sent, decoded, tf.nest.map_structure(tf.subtract, sent, decoded)


def weighted_feedback_step(update: Any, residual: Any, weight: Any, spec: DirectionSpec,
                           seed: int, weighted: bool, states: Any = None) -> tuple[Any, Any, list]:
  """`feedback_step` for a client whose update a mean aggregates (TensorFlow).

  A weighted mean (TFF's `MeanFactory`) encodes weight * value, multiplied
  as TFF multiplies it, so the client decodes that and divides the weight
  back out; the residual stays in update units. A client of weight 0 sends
  nothing and keeps all of update + residual. `states`: the server's encoder
  states (see `local_decode`).

  Returns:
    (sent, new_residual, state_updates): the value to hand to the
    aggregation, what the client keeps, and per tensor the state updates its
    encoder sends (empty tuples for stateless encoders).
  """
  sent = tf.nest.map_structure(tf.add, update, residual)
  if not weighted:
    decoded, updates = _local_encode(sent, spec, seed, states)
  else:
    scaled = tf.nest.map_structure(lambda x: x * tf.cast(weight, x.dtype), sent)
    decoded, updates = _local_encode(scaled, spec, seed, states)
    decoded = tf.nest.map_structure(
        lambda d: tf.math.divide_no_nan(d, tf.cast(weight, d.dtype)), decoded)
  return sent, tf.nest.map_structure(tf.subtract, sent, decoded), updates


def residual_sums(residual: Any) -> dict:
  """One client's contributions to the error-feedback measurements
  (TensorFlow): its new residual's L2 norm and a count of 1."""
  norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(r)) for r in tf.nest.flatten(residual)]))
  return {"residual_norm": norm, "clients": tf.constant(1.0)}


def finalize_sums(sums: dict) -> dict:
  """Summed `residual_sums` -> `residual_norm`, the mean over aggregated clients."""
  return {"residual_norm": sums["residual_norm"] / tf.maximum(sums["clients"], 1.0)}
