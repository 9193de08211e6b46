"""Error feedback on the upload as a wrapper around client work (Seide et al.
2014; Karimireddy et al. 2019, EF-SGD), applied from outside the algorithm the
way Flower wraps a strategy for DP.

A wrapped client keeps a residual e besides whatever state the inner work
keeps. When sampled it runs the inner work's rule to its update u, hands
u + e to the aggregation and keeps e <- (u + e) - C(u + e), C being the
aggregation's encoder, which the client runs itself
(`fedsim.compression.error_feedback`). `fedsim.learning.stages` wraps every
synchronous algorithm's client work when the aggregation's `encode` stage
says `error_feedback: true`; algorithms never opt in. Only work whose update
is a model delta (`ClientWork.model_delta`) has a residual to carry.
"""

from __future__ import annotations

import collections

import numpy as np

from fedsim.errors import UserError
from fedsim.learning.client_work import ClientWork, SharedState, build_stateful_client_work

# Client-state keys. The run loop finds a residual by RESIDUAL at the top of
# the state (`experiment.client_states`, for the residual ages it logs).
RESIDUAL = "residual"
INNER = "inner"      # the wrapped work's own client state, when it keeps one
MEASUREMENT = "error_feedback"   # the measurements' key: error_feedback/residual_norm


def apply_upload_feedback(task, work: ClientWork, aggregation: str,
                          keeps_client_state: bool = True) -> ClientWork:
  """`work`, wrapped in error feedback if the aggregation's encode stage asks for it.

  Args:
    task: the `Task`; its aggregation chain says whether to wrap.
    work: the algorithm's client work.
    aggregation: how the algorithm combines updates ('weighted_mean', 'mean'
      or 'sum'); a weighted mean encodes n_i * value (TFF's `MeanFactory`).
    keeps_client_state: False when the algorithm's schedule runs its clients
      without client state (FedBuff's buffered rounds).

  Returns:
    `work` itself when no stage asks for error feedback, else
    `with_error_feedback(task, work, ...)`.

  Raises:
    UserError: naming `aggregation[i].error_feedback`, when the work's update
      is not a model delta or its clients keep no state.
  """
  from fedsim.compression.error_feedback import upload_feedback
  spec = upload_feedback(task.aggregation)
  if spec is None:
    return work
  index = next(i for i, s in enumerate(task.aggregation)
               if s.name == "encode" and getattr(s.params, "error_feedback", False))
  key = f"aggregation[{index}].error_feedback"
  if not work.model_delta:
    raise UserError(f"{key}: this algorithm's upload is not a model delta alone, so its"
                    " clients have no residual to carry (fedavg, fedprox and fedsgd do)")
  if not keeps_client_state:
    raise UserError(f"{key}: this algorithm's clients keep no state between rounds, so"
                    " none can keep a residual (fedavg, fedprox and fedsgd do)")
  return with_error_feedback(task, work, spec, weighted=aggregation == "weighted_mean")


def with_error_feedback(task, work: ClientWork, spec, weighted: bool) -> ClientWork:
  """Client work that runs `work` and keeps what the encoder drops of its update.

  Args:
    task: the `Task` (model, batch size, run seed: the encoder's noise key).
    work: client work whose update is a model delta, stateless or stateful
      (with or without a shared value), reporting no extra metrics.
    spec: the aggregation's encode stage (a `DirectionSpec`).
    weighted: the aggregation is a weighted mean: the client decodes
      n_i (u + e), as the mean encodes it, and divides n_i back out.

  Returns:
    Stateful ClientWork. Its client state is `{residual}` (one float tensor
    per trainable weight, zero for a new client) or, when `work` keeps state,
    `{inner: work's state, residual}`. Its measurements add
    `error_feedback/residual_norm`, the mean L2 norm of the new residuals.

  Raises:
    ValueError: `work` is not a model delta, or already reports extra metrics.
  """
  import tensorflow_federated as tff

  from fedsim.compression import error_feedback as ef
  if not work.model_delta or "extra" in tff.structure.name_list(work.metrics_type):
    raise ValueError("error feedback wraps client work whose update is a model delta"
                     " and that reports no extra metrics")
  stateful = work.client_state_type is not None
  residual = tuple(np.zeros_like(w) for w in task.model.initial_weights.trainable)
  initial = collections.OrderedDict(
      [(INNER, work.initial_client_state)] if stateful else [])
  initial[RESIDUAL] = residual
  shared, mirrored = _with_encoder_states(task, work.shared, spec)

  def update_fn(model_weights, batches, client_state, *shared_value):
    inner_shared, states = shared_value, None
    if mirrored:
      states = shared_value[0] if work.shared is None else shared_value[0][1]
      inner_shared = () if work.shared is None else (shared_value[0][0],)
    if stateful:
      update, weight, stats, inner, *contribution = work.client_update(
          model_weights, batches, client_state[INNER], *inner_shared)
    else:
      (update, weight, stats), contribution = work.client_update(model_weights, batches), []
    sent, new_residual, updates = ef.weighted_feedback_step(
        update, client_state[RESIDUAL], weight, spec, task.seed, weighted, states)
    if mirrored:
      contribution = [updates] if work.shared is None else [(contribution[0], updates)]
    new_state = collections.OrderedDict([(INNER, inner)] if stateful else [])
    new_state[RESIDUAL] = new_residual
    return (sent, weight, (stats, ef.residual_sums(new_residual)), new_state, *contribution)

  return build_stateful_client_work(
      task.model.weights_type, task.model.client_data_type(task.batch_size), initial,
      update_fn, shared=shared, extra_metrics=(MEASUREMENT, ef.finalize_sums))


def _with_encoder_states(task, inner: SharedState | None, spec) -> tuple[SharedState | None, bool]:
  """The wrapped work's shared value, extended by the client's copy of the
  server's encoder states when the encoder keeps state (powersgd's warm start),
  and whether it was: (inner's value, the states) if inner has one, else the states.

  The copy starts from the encoders' initial states and is updated by their own
  rule from the sum of the clients' state updates, as the aggregation updates
  the server's, so the client encodes from the factor the server will use.
  """
  import tensorflow as tf

  from fedsim.compression import error_feedback as ef
  specs = [tf.TensorSpec(w.shape, tf.as_dtype(w.dtype))
           for w in task.model.initial_weights.trainable]
  states = ef.initial_encoder_states(specs, spec, task.seed)
  if states is None:
    return inner, False
  own = SharedState(states, lambda value, total: ef.updated_encoder_states(
      value, total, specs, spec, task.seed))
  if inner is None:
    return own, True
  return SharedState((inner.initial, own.initial), lambda value, total: (
      inner.update(value[0], total[0]), own.update(value[1], total[1]))), True
