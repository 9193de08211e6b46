"""Buffered server updates: a process whose `next` aggregates updates that clients
computed earlier, each from the model version it downloaded (asynchronous FL).

The client work runs outside the process, when the run loop dispatches clients
(`BufferedAlgorithm.dispatch`: they download the model through the broadcast
chain and train on what they decoded); `next(state, arrivals)` takes the buffer of arrived results, each with its staleness s (server
versions since the client downloaded), weighs them, and applies the aggregation
chain and the server optimizer. The wire is sized from the synchronous round of
the same stages (`sizing_process`): a dispatched client downloads the model once
and uploads what the aggregation chain makes of its update once.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.task import FederatedAlgorithm


@dataclasses.dataclass(frozen=True)
class BufferedAlgorithm(FederatedAlgorithm):
  """An algorithm whose server updates once a buffer of asynchronous updates is full.

  `process.next(state, arrivals)`: `arrivals` is a list, in arrival order, of
  `Arrival` mappings (a client's `client_update` result plus its staleness).
  """

  schedule = "buffered"

  # (distributor state@S, model weights@S, packed batches@C) -> (distributor
  # state@S, ClientResult(update, update_weight)@C, stats@C): see `compose_dispatch`.
  client_update: Any = None
  concurrency: int | None = None   # clients training at once; None: clients_per_round
  max_staleness: int | None = None  # staler arrivals are dropped; None: none dropped

  def dispatch(self, state, client_data: list) -> tuple[Any, list]:
    """Clients download the current model and train on it, now.

    Returns (`state` with the distributor's new state, one `(ClientResult,
    stats)` per client of `client_data`, in order).
    """
    if not client_data:
      return state, []
    distributor, results, stats = self.client_update(
        state.distributor, state.global_model_weights, client_data)
    return state._replace(distributor=distributor), list(zip(results, stats))


def arrival(result, stats, staleness: int) -> collections.OrderedDict:
  """One buffered update as `next` takes it, from a `client_update` result (NumPy)."""
  return collections.OrderedDict(
      update=tuple(np.asarray(u) for u in result.update),
      update_weight=np.float32(result.update_weight),
      stats=collections.OrderedDict((k, np.float32(v)) for k, v in stats.items()),
      staleness=np.float32(staleness))


def compose_dispatch(distributor: tff.templates.MeasuredProcess,
                     client_fn: tff.Computation) -> tff.Computation:
  """Downloads through `distributor` and trains with `client_fn`, for the clients given.

  The clients train on what they decoded (an 8-bit broadcast: the 8-bit model),
  and the distributor's state advances once per call, as in a synchronous round.
  """
  weights_type, data_type = client_fn.type_signature.parameter

  @tff.federated_computation(distributor.initialize.type_signature.result,
                             tff.FederatedType(weights_type, tff.SERVER),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def dispatch(state, weights, data):
    sent = distributor.next(state, weights)
    result, stats = tff.federated_map(client_fn, (sent.result, data))
    return sent.state, result, stats

  return dispatch


def compose_buffered(initial_weights_fn: tff.Computation,
                     distributor: tff.templates.MeasuredProcess,
                     client_fn: tff.Computation, finalize_metrics: tff.Computation,
                     weigh: Callable, aggregator: tff.templates.AggregationProcess,
                     finalizer: tff.templates.MeasuredProcess) -> tff.templates.IterativeProcess:
  """The server side of a buffered round: weigh -> aggregate -> server optimizer step.

  `weigh(update, update_weight, staleness) -> (update, weight)` (TensorFlow)
  is what the aggregator receives from each arrival. The state has the layout
  of `composer.compose` (the distributor's state included, unused here) so that
  checkpoints and `model_weights` treat it like any other algorithm's.
  Measurements: `client_work` (the arrivals' training statistics), `aggregator`
  and `finalizer`.
  """
  result_type, stats_type = client_fn.type_signature.result
  arrival_type = tff.types.to_type(collections.OrderedDict(
      update=result_type.update, update_weight=result_type.update_weight,
      stats=stats_type, staleness=np.float32))

  @tff.tensorflow.computation(arrival_type)
  def split(item):
    update, weight = weigh(tuple(item["update"]), item["update_weight"], item["staleness"])
    return update, weight, item["stats"]

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=tff.federated_eval(initial_weights_fn, tff.SERVER),
        distributor=distributor.initialize(),
        client_work=tff.federated_value((), tff.SERVER),
        aggregator=aggregator.initialize(),
        finalizer=finalizer.initialize()))

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(arrival_type, tff.CLIENTS))
  def next_fn(state, arrivals):
    update, weight, stats = tff.federated_map(split, arrivals)
    aggregated = aggregator.next(state.aggregator, update, weight)
    finished = finalizer.next(state.finalizer, state.global_model_weights, aggregated.result)
    new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=finished.result,
        distributor=state.distributor,
        client_work=state.client_work,
        aggregator=aggregated.state,
        finalizer=finished.state))
    measurements = tff.federated_zip(collections.OrderedDict(
        client_work=tff.federated_map(finalize_metrics, tff.federated_sum(stats)),
        aggregator=aggregated.measurements,
        finalizer=finished.measurements))
    return new_state, measurements

  return tff.templates.IterativeProcess(init_fn, next_fn)


def scale_update(update, factor):
  """`factor` x every tensor of `update` (a tuple), in the update's dtype."""
  return tuple(tf.cast(factor, u.dtype) * u for u in update)
