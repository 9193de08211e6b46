"""The client-work stage: what each sampled client computes in a round.

Like TFF's `ClientWorkProcess`, but its client data is a structure of dense
tensors (padded batches + mask) instead of a tf.data sequence, which TFF's
template does not accept. `next(state@S, weights@C, data@C)` returns the
per-client `ClientResult(update, update_weight)` and round measurements that
are sums over clients (loss, correct predictions, examples).
"""

from __future__ import annotations

import collections
from typing import Any, Callable, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class ClientWork(NamedTuple):
  process: tff.templates.MeasuredProcess
  # What each client sends besides its update: summed metrics, update weight.
  metrics_type: tff.Type
  weight_type: tff.Type
  # Stateful clients only: the state's type and its value for a new client.
  client_state_type: tff.Type | None = None
  initial_client_state: Any = None
  # Stateless work only: one client's TF computation (weights, data) ->
  # (ClientResult, summed statistics), and the statistics -> measurements
  # finalizer, for loops that run clients one at a time (fedbuff).
  client_fn: Any = None
  finalize_metrics: Any = None


def _is_sequence(data_type) -> bool:
  """True when each example has a sequence of labels ([steps, batch, time])."""
  return len(data_type.y.shape) > 2


def _metrics_finalizer(sequence: bool):
  """Summed client statistics -> loss and accuracy per target, and examples.

  Sequence tasks also send their token count: their loss and accuracy are
  token-weighted means (see `local_training.BatchStats`).
  """
  spec = collections.OrderedDict(loss_sum=np.float32, correct=np.float32,
                                 num_examples=np.float32)
  if sequence:
    spec["num_tokens"] = np.float32

  @tff.tensorflow.computation(spec)
  def finalize(sums):
    return _finalize_sums(sums, sequence)
  return finalize


def _finalize_sums(sums, sequence: bool) -> collections.OrderedDict:
  """`_metrics_finalizer`'s rule in TensorFlow, for finalizers that extend it."""
  total = tf.maximum(sums["num_tokens"] if sequence else sums["num_examples"], 1.0)
  return collections.OrderedDict(
      loss=sums["loss_sum"] / total, accuracy=sums["correct"] / total,
      num_examples=sums["num_examples"])


def _stats_dict(stats, sequence: bool):
  out = collections.OrderedDict(
      loss_sum=stats.loss_sum, correct=stats.correct, num_examples=stats.num_examples)
  if sequence:
    out["num_tokens"] = stats.num_targets
  return out


def build_client_work(weights_type, data_type, client_update: Callable) -> ClientWork:
  """Wraps `client_update(model_weights, batches) -> (update, update_weight, stats)`.

  `stats` is a `BatchStats`; the server receives its sum over clients as
  `train/loss`, `train/accuracy` (per target: example or token) and
  `train/num_examples`.
  """

  @tff.tensorflow.computation(weights_type, data_type)
  def client_fn(model_weights, batches):
    update, update_weight, stats = client_update(model_weights, batches)
    result = tff.learning.templates.ClientResult(update=update, update_weight=update_weight)
    return result, _stats_dict(stats, _is_sequence(data_type))

  finalize = _metrics_finalizer(_is_sequence(data_type))

  @tff.federated_computation()
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, model_weights, data):
    result, stats = tff.federated_map(client_fn, (model_weights, data))
    measurements = tff.federated_map(finalize, tff.federated_sum(stats))
    return tff.templates.MeasuredProcessOutput(state, result, measurements)

  process = tff.templates.MeasuredProcess(init_fn, next_fn, next_is_multi_arg=True)
  result_type = client_fn.type_signature.result
  return ClientWork(process, result_type[1], result_type[0].update_weight,
                    client_fn=client_fn, finalize_metrics=finalize)


class SharedState(NamedTuple):
  """A value the client-work stage keeps on the server and sends to every
  sampled client with the model (SCAFFOLD's server control variate), updated
  each round from a plain float sum of what the clients contribute to it."""

  initial: Any          # NumPy structure: the value before the first round
  update: Callable      # (value, summed contributions) -> new value (TensorFlow)


def build_stateful_client_work(weights_type, data_type, initial_client_state,
                               client_update: Callable,
                               shared: SharedState | None = None,
                               extra_metrics: tuple[str, Callable] | None = None) -> ClientWork:
  """Client work whose clients keep state between the rounds they take part in.

  `client_update(model_weights, batches, client_state) -> (update,
  update_weight, stats, new_client_state)`; `initial_client_state` is the
  NumPy structure a client starts from (the run loop stores states on disk).
  With `shared`, `client_update` also takes the shared value and returns a
  fifth element, its contribution to the sum that updates the shared value.
  The shared value is this stage's server state (checkpointed with it); it
  and the contributions cross the wire unencoded, outside the aggregation chain.
  With `extra_metrics = (name, finalize)`, `stats` is a pair (BatchStats, a
  dict of per-client values); their sums over clients go through `finalize`
  (TensorFlow, dict -> dict) into the measurements under `name`.
  """
  def type_of(structure):
    return tff.types.tensorflow_to_type(tf.nest.map_structure(
        lambda a: tf.TensorSpec(np.shape(a), tf.as_dtype(np.asarray(a).dtype)), structure))

  state_type = type_of(initial_client_state)
  sequence = _is_sequence(data_type)
  finalize = _metrics_finalizer(sequence)

  def one_client(*args):
    update, update_weight, stats, new_state, *contribution = client_update(*args)
    result = tff.learning.templates.ClientResult(update=update, update_weight=update_weight)
    if extra_metrics is None:
      return ((result, new_state), _stats_dict(stats, sequence), *contribution)
    stats, extra = stats
    sums = _stats_dict(stats, sequence)
    sums["extra"] = collections.OrderedDict(sorted(extra.items()))
    return ((result, new_state), sums, *contribution)

  if extra_metrics is not None:
    def finalize_all(sums):
      out = _finalize_sums(sums, sequence)
      out[extra_metrics[0]] = collections.OrderedDict(
          sorted(extra_metrics[1](sums["extra"]).items()))
      return out

  if shared is None:
    client_fn = tff.tensorflow.computation(
        lambda model_weights, batches, client_state: one_client(
            model_weights, batches, client_state),
        weights_type, data_type, state_type)
  else:
    shared_type = type_of(shared.initial)
    client_fn = tff.tensorflow.computation(
        lambda model_weights, batches, client_state, shared_value: one_client(
            model_weights, batches, client_state, shared_value),
        weights_type, data_type, state_type, shared_type)

  if shared is None:
    @tff.federated_computation()
    def init_fn():
      return tff.federated_value((), tff.SERVER)
  else:
    @tff.tensorflow.computation
    def initial_shared():
      return tf.nest.map_structure(tf.constant, shared.initial)

    @tff.tensorflow.computation(shared_type, client_fn.type_signature.result[2])
    def update_shared(value, total):
      return shared.update(value, total)

    @tff.federated_computation()
    def init_fn():
      return tff.federated_eval(initial_shared, tff.SERVER)

  if extra_metrics is not None:
    finalize = tff.tensorflow.computation(finalize_all, client_fn.type_signature.result[1])

  @tff.federated_computation(
      init_fn.type_signature.result, tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS), tff.FederatedType(state_type, tff.CLIENTS))
  def next_fn(state, model_weights, data, client_states):
    if shared is None:
      outputs, stats = tff.federated_map(client_fn, (model_weights, data, client_states))
    else:
      outputs, stats, contributions = tff.federated_map(
          client_fn, (model_weights, data, client_states, tff.federated_broadcast(state)))
      state = tff.federated_map(update_shared, (state, tff.federated_sum(contributions)))
    measurements = tff.federated_map(finalize, tff.federated_sum(stats))
    return tff.templates.MeasuredProcessOutput(state, outputs, measurements)

  process = tff.templates.MeasuredProcess(init_fn, next_fn, next_is_multi_arg=True)
  result_type = client_fn.type_signature.result
  return ClientWork(process, result_type[1], result_type[0][0].update_weight,
                    state_type, initial_client_state)


def model_delta_client_work(task, optimizer, uniform_weighting: bool, accumulation=None,
                            keep_optimizer_state: bool = False,
                            extra_gradient: Callable | None = None,
                            error_feedback=None) -> ClientWork:
  """Client work that trains locally and sends `received - trained` weights.

  Args:
    task: the `Task` (model, batch size).
    optimizer: the client's `tff.learning.optimizers.Optimizer`.
    uniform_weighting: every client weighs 1 instead of its examples.
    accumulation: a `local_training.Accumulation` (None: one batch a step).
    keep_optimizer_state: each client keeps its optimizer state (momentum,
      Adam's moments and step) across the rounds it takes part in, as coMind's
      FedAvg workers keep their optimizer slots; False starts it fresh.
    extra_gradient: `received weights -> (weights -> gradient)`, a term added
      to every batch gradient (FedProx's proximal pull), or None.
    error_feedback: `(DirectionSpec, run seed)` of the aggregation's encode
      stage when it has `error_feedback: true`: each client keeps what the
      encoder drops as a residual, adds it to its next update, and reports the
      mean residual L2 norm as `error_feedback/residual_norm`; or None.

  Returns:
    The ClientWork; stateful (client state on disk) when optimizer state is
    kept, accumulation carries a partial window over, or error feedback keeps
    residuals.
  """
  from fedsim.compression import error_feedback as ef
  from fedsim.learning import local_training
  from fedsim.learning.optimizers import state_as_arrays, stored_or_initial
  accumulation = accumulation or local_training.Accumulation()
  predict = task.model.predict
  trainable = task.model.initial_weights.trainable
  specs = tuple(tf.TensorSpec(w.shape, w.dtype) for w in trainable)
  data_type = task.model.client_data_type(task.batch_size)

  def train(model_weights, batches, optimizer_state, window):
    received = tuple(model_weights.trainable)
    result = local_training.train(
        predict, optimizer, received, optimizer_state, batches, accumulation,
        extra_gradient(received) if extra_gradient is not None else None,
        task.model.pad_label, window)
    delta = tuple(r - t for r, t in zip(received, result.weights))
    weight = tf.constant(1.0) if uniform_weighting else result.stats.num_examples
    return delta, weight, result

  if not (keep_optimizer_state or accumulation.carry or error_feedback):
    def update_fn(model_weights, batches):
      delta, weight, result = train(model_weights, batches, optimizer.initialize(specs), None)
      return delta, weight, result.stats
    return build_client_work(task.model.weights_type, data_type, update_fn)

  initial = collections.OrderedDict(initialized=np.float32(0.0))
  if keep_optimizer_state:
    initial["optimizer_state"] = state_as_arrays(optimizer, specs)
  if accumulation.carry:
    initial["window"] = empty_window_arrays(trainable)
  if error_feedback:
    initial["residual"] = tuple(np.zeros_like(w) for w in trainable)

  def stateful_update_fn(model_weights, batches, client_state):
    fresh = tf.nest.map_structure(tf.convert_to_tensor, optimizer.initialize(specs))
    optimizer_state = (stored_or_initial(client_state["initialized"] > 0,
                                         client_state["optimizer_state"], fresh)
                       if keep_optimizer_state else fresh)
    window = client_state["window"] if accumulation.carry else None
    delta, weight, result = train(model_weights, batches, optimizer_state, window)
    new_state = collections.OrderedDict(initialized=tf.constant(1.0))
    if keep_optimizer_state:
      new_state["optimizer_state"] = result.optimizer_state
    if accumulation.carry:
      new_state["window"] = window_state(result.window)
    if not error_feedback:
      return delta, weight, result.stats, new_state
    spec, seed = error_feedback
    sent, new_state["residual"] = ef.weighted_feedback_step(
        delta, client_state["residual"], weight, spec, seed, weighted=not uniform_weighting)
    return sent, weight, (result.stats, ef.residual_sums(new_state["residual"])), new_state

  return build_stateful_client_work(
      task.model.weights_type, data_type, initial, stateful_update_fn,
      extra_metrics=("error_feedback", ef.finalize_sums) if error_feedback else None)


def error_feedback_client_work(task, update_fn: Callable, uniform_weighting: bool,
                               error_feedback) -> ClientWork:
  """Stateless client work `update_fn(model_weights, batches) -> (update,
  update_weight, stats)` made to keep an error-feedback residual per client
  (see `model_delta_client_work`'s `error_feedback`)."""
  from fedsim.compression import error_feedback as ef
  spec, seed = error_feedback
  initial = collections.OrderedDict(residual=tuple(
      np.zeros_like(w) for w in task.model.initial_weights.trainable))

  def stateful_update_fn(model_weights, batches, client_state):
    update, weight, stats = update_fn(model_weights, batches)
    sent, residual = ef.weighted_feedback_step(
        update, client_state["residual"], weight, spec, seed, weighted=not uniform_weighting)
    return (sent, weight, (stats, ef.residual_sums(residual)),
            collections.OrderedDict(residual=residual))

  return build_stateful_client_work(
      task.model.weights_type, task.model.client_data_type(task.batch_size), initial,
      stateful_update_fn, extra_metrics=("error_feedback", ef.finalize_sums))


def empty_window_arrays(trainable) -> collections.OrderedDict:
  """A client's carried accumulation window before it has any (NumPy, for disk)."""
  return collections.OrderedDict(grads=tuple(np.zeros_like(w) for w in trainable),
                                 passes=np.float32(0.0), targets=np.float32(0.0))


def window_state(window) -> collections.OrderedDict:
  """A carried window (from `local_training.train`) in the client state's layout."""
  return collections.OrderedDict((k, window[k]) for k in ("grads", "passes", "targets"))
