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


def client_data_type(input_shape, batch_size: int, x_dtype=np.float32,
                     label_shape=()) -> tff.types.StructType:
  """TFF type of one client's packed batches; the step count is dynamic.

  `label_shape` is () for one label per example, (T,) for sequence targets.
  """
  return tff.types.to_type(collections.OrderedDict(
      x=tff.TensorType(np.dtype(x_dtype), [None, batch_size, *input_shape]),
      y=tff.TensorType(np.int32, [None, batch_size, *label_shape]),
      mask=tff.TensorType(np.float32, [None, batch_size]),
  ))


class ClientWork(NamedTuple):
  process: tff.templates.MeasuredProcess
  # What each client sends besides its update: summed metrics, update weight.
  metrics_type: tff.Type
  weight_type: tff.Type
  # Stateful clients only: the state's type and its value for a new client.
  client_state_type: tff.Type | None = None
  initial_client_state: Any = None


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
    total = tf.maximum(sums["num_tokens"] if sequence else sums["num_examples"], 1.0)
    return collections.OrderedDict(
        loss=sums["loss_sum"] / total, accuracy=sums["correct"] / total,
        num_examples=sums["num_examples"])
  return finalize


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
  return ClientWork(process, result_type[1], result_type[0].update_weight)


def build_stateful_client_work(weights_type, data_type, initial_client_state,
                               client_update: Callable) -> ClientWork:
  """Client work whose clients keep state between the rounds they take part in.

  `client_update(model_weights, batches, client_state) -> (update,
  update_weight, stats, new_client_state)`; `initial_client_state` is the
  NumPy structure a client starts from (the run loop stores states on disk).
  """
  state_type = tff.types.tensorflow_to_type(tf.nest.map_structure(
      lambda a: tf.TensorSpec(np.shape(a), tf.as_dtype(np.asarray(a).dtype)),
      initial_client_state))

  @tff.tensorflow.computation(weights_type, data_type, state_type)
  def client_fn(model_weights, batches, client_state):
    update, update_weight, stats, new_state = client_update(model_weights, batches, client_state)
    result = tff.learning.templates.ClientResult(update=update, update_weight=update_weight)
    return (result, new_state), _stats_dict(stats, _is_sequence(data_type))

  finalize = _metrics_finalizer(_is_sequence(data_type))

  @tff.federated_computation()
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  @tff.federated_computation(
      init_fn.type_signature.result, tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS), tff.FederatedType(state_type, tff.CLIENTS))
  def next_fn(state, model_weights, data, client_states):
    outputs, stats = tff.federated_map(client_fn, (model_weights, data, client_states))
    measurements = tff.federated_map(finalize, tff.federated_sum(stats))
    return tff.templates.MeasuredProcessOutput(state, outputs, measurements)

  process = tff.templates.MeasuredProcess(init_fn, next_fn, next_is_multi_arg=True)
  result_type = client_fn.type_signature.result
  return ClientWork(process, result_type[1], result_type[0][0].update_weight,
                    state_type, initial_client_state)
