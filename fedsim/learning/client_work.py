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
  # The per-client rule the work was built from (TensorFlow): `(weights,
  # batches[, client_state[, shared value]]) -> (update, update_weight, stats[,
  # new_client_state[, contribution]])`, and the shared value's rule, so that a
  # wrapper can rebuild the work around it (`with_client_memory`).
  client_update: Callable | None = None
  shared: SharedState | None = None
  # The update is a change of the received trainable weights that the server
  # applies (received - trained, or a gradient: one unit-rate step's change),
  # one tensor per trainable weight, and nothing else: an encoder's loss on it
  # can be carried over to the client's next update.
  model_delta: bool = False


def _is_sequence(data_type) -> bool:
  """True when each example has a sequence of labels ([steps, batch, time])."""
  return len(data_type.y.shape) > 2


def metrics_finalizer(sequence: bool):
  """Summed client statistics -> loss and accuracy per target, and examples.

  Sequence tasks also send their token count: their loss and accuracy are
  token-weighted means (see `loss.BatchStats`).
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
  """`metrics_finalizer`'s rule in TensorFlow, for finalizers that extend it."""
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


def build_client_work(weights_type, data_type, client_update: Callable,
                      model_delta: bool = False) -> ClientWork:
  """Wraps `client_update(model_weights, batches) -> (update, update_weight, stats)`.

  `stats` is a `BatchStats`; the server receives its sum over clients as
  `train/loss`, `train/accuracy` (per target: example or token) and
  `train/num_examples`. `model_delta`: see `ClientWork.model_delta`.
  """

  @tff.tensorflow.computation(weights_type, data_type)
  def client_fn(model_weights, batches):
    update, update_weight, stats = client_update(model_weights, batches)
    result = tff.learning.templates.ClientResult(update=update, update_weight=update_weight)
    return result, _stats_dict(stats, _is_sequence(data_type))

  return stateless_client_work(weights_type, data_type, client_fn,
                               metrics_finalizer(_is_sequence(data_type)),
                               client_update=client_update, model_delta=model_delta)


def stateless_client_work(weights_type, data_type, client_fn: tff.Computation,
                          finalize: tff.Computation, client_update: Callable | None = None,
                          model_delta: bool = False) -> ClientWork:
  """The client-work stage around `client_fn(model_weights, data) -> (ClientResult,
  statistics)`: clients keep no state, and the server's measurements are
  `finalize` of the statistics summed over clients."""

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
                    client_fn=client_fn, finalize_metrics=finalize,
                    client_update=client_update, model_delta=model_delta)


class SharedState(NamedTuple):
  """A value the client-work stage keeps on the server and sends to every
  sampled client with the model (SCAFFOLD's server control variate), updated
  each round from a plain float sum of what the clients contribute to it."""

  initial: Any          # NumPy structure: the value before the first round
  update: Callable      # (value, summed contributions) -> new value (TensorFlow)


def build_stateful_client_work(weights_type, data_type, initial_client_state,
                               client_update: Callable,
                               shared: SharedState | None = None,
                               extra_metrics: tuple[str, Callable] | None = None,
                               model_delta: bool = False) -> ClientWork:
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
  `model_delta`: see `ClientWork.model_delta`.
  """
  def type_of(structure):
    return tff.types.tensorflow_to_type(tf.nest.map_structure(
        lambda a: tf.TensorSpec(np.shape(a), tf.as_dtype(np.asarray(a).dtype)), structure))

  state_type = type_of(initial_client_state)
  sequence = _is_sequence(data_type)
  finalize = metrics_finalizer(sequence)

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
                    state_type, initial_client_state, client_update=client_update,
                    shared=shared, model_delta=model_delta)


def empty_window_arrays(trainable) -> collections.OrderedDict:
  """A client's carried accumulation window before it has any (NumPy, for disk)."""
  return collections.OrderedDict(grads=tuple(np.zeros_like(w) for w in trainable),
                                 passes=np.float32(0.0), targets=np.float32(0.0))


def window_state(window) -> collections.OrderedDict:
  """A carried window (from `local_training.train`) in the client state's layout."""
  return collections.OrderedDict((k, window[k]) for k in ("grads", "passes", "targets"))


INNER = "inner"   # a wrapped work's own client state, beside the memory's entry


def with_client_memory(weights_type, data_type, work: ClientWork, memory) -> ClientWork:
  """Client work that runs `work` and keeps `memory` per client, wrapped from
  outside the algorithm (error feedback's residual: `fedsim.compression.feedback`).

  Args:
    weights_type, data_type: as `build_stateful_client_work` takes them.
    work: client work whose update is a model delta, stateless or stateful
      (with or without a shared value), reporting no extra metrics.
    memory: a `fedsim.compression.feedback.ClientMemory`: its `step` turns the
      work's update into what is sent and the memory kept.

  Returns:
    Stateful ClientWork. Its client state is `{memory.key}` or, when `work`
    keeps state, `{inner: work's state, memory.key}`. Its shared value is the
    memory's, the work's, or the pair (work's, memory's). Its measurements add
    `memory.measurement`.

  Raises:
    ValueError: `work` is not a model delta, or already reports extra metrics.
  """
  if not work.model_delta or "extra" in tff.structure.name_list(work.metrics_type):
    raise ValueError("a client memory wraps client work whose update is a model delta"
                     " and that reports no extra metrics")
  stateful = work.client_state_type is not None
  own = memory.shared_initial is not None
  initial = collections.OrderedDict([(INNER, work.initial_client_state)] if stateful else [])
  initial[memory.key] = memory.initial

  def update_fn(model_weights, batches, client_state, *shared_value):
    inner_shared, mine = shared_value, None
    if own:
      mine = shared_value[0] if work.shared is None else shared_value[0][1]
      inner_shared = () if work.shared is None else (shared_value[0][0],)
    if stateful:
      update, weight, stats, inner, *contribution = work.client_update(
          model_weights, batches, client_state[INNER], *inner_shared)
    else:
      (update, weight, stats), contribution = work.client_update(model_weights, batches), []
    sent, kept, part, sums = memory.step(update, weight, client_state[memory.key], mine)
    if own:
      contribution = [part] if work.shared is None else [(contribution[0], part)]
    new_state = collections.OrderedDict([(INNER, inner)] if stateful else [])
    new_state[memory.key] = kept
    return (sent, weight, (stats, sums), new_state, *contribution)

  shared = work.shared
  if own:
    mine = SharedState(memory.shared_initial, memory.shared_update)
    shared = mine if work.shared is None else SharedState(
        (work.shared.initial, mine.initial), lambda value, total: (
            work.shared.update(value[0], total[0]), mine.update(value[1], total[1])))
  return build_stateful_client_work(
      weights_type, data_type, initial, update_fn, shared=shared,
      extra_metrics=(memory.measurement, memory.finalize))
