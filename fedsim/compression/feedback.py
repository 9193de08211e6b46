"""Error feedback (Seide et al. 2014; Karimireddy et al. 2019, EF-SGD): whoever
encodes keeps what its encoder dropped and adds it to what it sends next.

Upload: each client keeps a residual e. When sampled it sends C(u + e) and
keeps e <- (u + e) - C(u + e). fedsim's encoders are pure functions of the
values encoded, the run seed and the tensor's flat index
(`encoders.encoder_at`), so a client computes C(u + e) itself with the encoder
the aggregation will use and hands u + e to the aggregation, which encodes it
to the very same bits. No encoded value crosses the wire twice; the residual
never leaves the client. The residual is a `ClientMemory` that
`fedsim.learning.client_work.with_client_memory` wraps around any algorithm's
client work whose update is a model delta; algorithms never opt in.

An encoder with state (powersgd's warm-start factor) is a function of the
server's state too. The client then keeps a copy of that state, sent down
with the model and updated from the same sum of the clients' state updates
(`initial_encoder_states`, `updated_encoder_states`): that copy crosses the
wire besides the aggregation's own, once each way.

Download (DoubleSqueeze, Tang et al. 2019): the server encodes x_t = w_t + e_t,
every client decodes C(x_t), and e_{t+1} = x_t - C(x_t), the server decoding
its own encoding to know it (`add_residual`, `server_residual`, used by
`fedsim.compression.broadcast`). That residual is server state, checkpointed
with it.

Measurements: `error_feedback/residual_norm` (L2; the mean over aggregated
clients on the upload), and from the client states' last-update rounds
`error_feedback/residual_age_mean` and `_max` (`residual_ages`).
"""

from __future__ import annotations

import collections
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from fedsim.compression import DirectionSpec, check_upload_feedback, upload_feedback
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.encoders import encoder_at, encoder_for

# A client's residual, under this key of its state (beside the wrapped work's own).
RESIDUAL = "residual"
MEASUREMENT = "error_feedback"   # the measurements' key: error_feedback/residual_norm
_AGE = f"{MEASUREMENT}/residual_age"


class ClientMemory(NamedTuple):
  """What a client keeps besides its work's own state, and how it changes the upload."""

  key: str                 # its entry in the client state
  initial: Any             # NumPy structure: a new client's memory
  # (update, weight, memory, shared) -> (sent, new memory, contribution to the
  # shared value's sum or None, per-client measurement sums) (TensorFlow).
  step: Callable
  shared_initial: Any      # NumPy: a value the server keeps and sends with the model, or None
  shared_update: Callable | None  # (value, summed contributions) -> new value (TensorFlow)
  measurement: str         # the measurements' key of `finalize`'s output
  finalize: Callable       # summed per-client sums -> measurements (TensorFlow)


def upload_memory(task, work, aggregation: str,
                  keeps_client_state: bool = True) -> ClientMemory | None:
  """The residual each client of `work` keeps, if the aggregation's encode stage
  asks for error feedback.

  Args:
    task: the `Task`; its aggregation chain says whether clients keep a residual.
    work: the algorithm's `ClientWork`.
    aggregation: how the algorithm combines updates ('weighted_mean', 'mean'
      or 'sum'); a weighted mean encodes n_i * value (TFF's `MeanFactory`),
      so the client decodes n_i (u + e) and divides n_i back out.
    keeps_client_state: False when the algorithm's schedule runs its clients
      without client state (FedBuff's buffered rounds).

  Returns:
    None when no stage asks for error feedback, else the memory: a residual
    of one float tensor per trainable weight, zero for a new client.

  Raises:
    UserError: naming `aggregation[i].error_feedback`, when the work's update
      is not a model delta or its clients keep no state.
  """
  spec = upload_feedback(task.aggregation)
  if spec is None:
    return None
  check_upload_feedback(task.aggregation, work.model_delta, keeps_client_state)
  weighted = aggregation == "weighted_mean"
  trainable = task.model.initial_weights.trainable
  specs = [tf.TensorSpec(w.shape, tf.as_dtype(w.dtype)) for w in trainable]
  # The client's copy of the server's encoder states, when the encoders keep state.
  states = initial_encoder_states(specs, spec, task.seed)

  def step(update, weight, residual, shared):
    sent, new_residual, updates = weighted_feedback_step(
        update, residual, weight, spec, task.seed, weighted, shared)
    return sent, new_residual, updates if states is not None else None, residual_sums(new_residual)

  return ClientMemory(
      RESIDUAL, tuple(np.zeros_like(w) for w in trainable), step, states,
      None if states is None else (
          lambda value, total: updated_encoder_states(value, total, specs, spec, task.seed)),
      MEASUREMENT, finalize_sums)


def _gather_encoder(tensor_spec: tf.TensorSpec, spec: DirectionSpec, seed: int, index: int):
  """The aggregation's encoder of the tensor at flat `index`, for many-to-one use."""
  return te_api.gather_encoder(encoder_at(tensor_spec, spec, seed, index), tensor_spec)


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


def weighted_feedback_step(update: Any, residual: Any, weight: Any, spec: DirectionSpec,
                           seed: int, weighted: bool, states: Any = None) -> tuple[Any, Any, list]:
  """One client's error-feedback step (TensorFlow).

  A weighted mean (TFF's `MeanFactory`) encodes weight * value, multiplied
  as TFF multiplies it, so the client decodes that and divides the weight
  back out; the residual stays in update units. A client of weight 0 sends
  nothing and keeps all of update + residual. `states`: the server's encoder
  states (see `local_decode`).

  Returns:
    (sent, new_residual, state_updates): sent = update + residual, the value
    to hand to the aggregation; new_residual = sent - C(sent), what the client
    keeps; per tensor the state updates its encoder sends (empty tuples for
    stateless encoders).
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


def _norm(residual: Any) -> tf.Tensor:
  """The L2 norm over every tensor of `residual`, in float32."""
  # l2_loss (half the sum of squares) is one pass over a tensor; a square and
  # a sum are two, and this runs per client every round.
  return tf.sqrt(2.0 * tf.add_n([tf.nn.l2_loss(tf.cast(r, tf.float32))
                                 for r in tf.nest.flatten(residual)]))


def residual_sums(residual: Any) -> dict:
  """One client's contributions to the error-feedback measurements
  (TensorFlow): its new residual's L2 norm and a count of 1."""
  return {"residual_norm": _norm(residual), "clients": tf.constant(1.0)}


def finalize_sums(sums: dict) -> dict:
  """Summed `residual_sums` -> `residual_norm`, the mean over aggregated clients."""
  return {"residual_norm": sums["residual_norm"] / tf.maximum(sums["clients"], 1.0)}


def initial_server_residual(flat_specs: Sequence[tf.TensorSpec]) -> list:
  """The broadcast's residual before its first round: zeros (TensorFlow)."""
  return [tf.zeros(s.shape, s.dtype) for s in flat_specs]


def add_residual(flat: Sequence[tf.Tensor], residual: Sequence[tf.Tensor]) -> list:
  """x_t = w_t + e_t per tensor: what the server encodes (TensorFlow)."""
  return [x + r for x, r in zip(flat, residual)]


def server_residual(sent: Sequence[tf.Tensor],
                    decoded: Sequence[tf.Tensor]) -> tuple[list, dict]:
  """(e_{t+1} = x_t - C(x_t) per tensor, the measurements `{residual_norm}`) (TensorFlow)."""
  residual = [x - d for x, d in zip(sent, decoded)]
  return residual, {"residual_norm": _norm(residual)}


def residual_ages(client_state: Any, last_updated: Sequence[int | None],
                  round_num: int) -> dict[str, float]:
  """`error_feedback/residual_age_mean` and `_max`: the rounds since each client's
  residual was last updated (`round_num` - the round its state was saved in),
  over the clients that carried one (a client never saved carries none).

  Args:
    client_state: the algorithm's initial client state: ages are measured only
      when it keeps a residual.
    last_updated: per client, the round its state was last saved in, or None.
    round_num: the round whose clients are measured.

  Returns:
    Those metrics, or {} when the state keeps no residual or no client carried one.
  """
  ages = [round_num - saved for saved in last_updated if saved is not None]
  if not ages or not (isinstance(client_state, dict) and RESIDUAL in client_state):
    return {}
  return {f"{_AGE}_mean": float(np.mean(ages)), f"{_AGE}_max": float(max(ages))}
