"""Buffered server updates: a process whose `next` aggregates updates that clients
computed earlier, each from the model version it downloaded (asynchronous FL).

The client work is a process of its own, run when the run loop dispatches clients
(`BufferedAlgorithm.dispatch_process`: they download the model through the
broadcast chain and train on what they decoded, each returning its result);
a runtime compiles it like any round. `next(state, arrivals)` takes the buffer
of arrived results, each with its staleness s (server versions since the
client downloaded), weighs them, and applies the aggregation chain and the
server optimizer. The wire is sized from the synchronous round of
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
  `arrival` mappings (a client's dispatch output plus its staleness).
  """

  schedule = "buffered"

  # Clients download the current model and train on it, now: `next(state,
  # packed batches@C) -> (state with the distributor's new state, the
  # distributor's measurements, outputs@C)`, one `OrderedDict(update,
  # update_weight, stats)` per client; `initialize` is `process`'s.
  dispatch_process: Any = None
  concurrency: int | None = None   # clients training at once; None: clients_per_round
  max_staleness: int | None = None  # staler arrivals are dropped; None: none dropped

  def dispatch_round(self) -> FederatedAlgorithm:
    """The dispatch as a round a runtime builds (`Runtime.build`), packed as this algorithm's."""
    return FederatedAlgorithm(process=self.dispatch_process, client_plan=self.client_plan)


def arrival(output, staleness: int) -> collections.OrderedDict:
  """One buffered update as `next` takes it, from a client's dispatch output."""
  return collections.OrderedDict(
      update=tuple(np.asarray(u) for u in output["update"]),
      update_weight=np.float32(output["update_weight"]),
      stats=collections.OrderedDict((k, np.float32(v)) for k, v in output["stats"].items()),
      staleness=np.float32(staleness))


def compose_buffered(initial_weights_fn: tff.Computation,
                     distributor: tff.templates.MeasuredProcess,
                     client_fn: tff.Computation, finalize_metrics: tff.Computation,
                     weigh: Callable, aggregator: tff.templates.AggregationProcess,
                     finalizer: tff.templates.MeasuredProcess
                     ) -> tuple[tff.templates.IterativeProcess, tff.templates.IterativeProcess]:
  """The server side of a buffered round (weigh -> aggregate -> server optimizer
  step) and its client dispatch (download through `distributor`, train with
  `client_fn`), as `(process, dispatch_process)` over one state.

  `weigh(update, update_weight, staleness) -> (update, weight)` (TensorFlow)
  is what the aggregator receives from each arrival. The state has the layout
  of `composer.compose` so that checkpoints and `model_weights` treat it like
  any other algorithm's; the dispatch advances its distributor's state once per
  call, as a synchronous round does, and its clients train on what they
  decoded (an 8-bit broadcast: the 8-bit model). Measurements of the server
  update: `client_work` (the arrivals' training statistics), `aggregator` and
  `finalizer`.
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
    new_state = _replaced(state, global_model_weights=finished.result,
                          aggregator=aggregated.state, finalizer=finished.state)
    measurements = tff.federated_zip(collections.OrderedDict(
        client_work=tff.federated_map(finalize_metrics, tff.federated_sum(stats)),
        aggregator=aggregated.measurements,
        finalizer=finished.measurements))
    return new_state, measurements

  weights_type, data_type = client_fn.type_signature.parameter

  @tff.tensorflow.computation(weights_type, data_type)
  def train(weights, data):
    result, stats = client_fn(weights, data)
    return collections.OrderedDict(update=result.update, update_weight=result.update_weight,
                                   stats=stats)

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(data_type, tff.CLIENTS))
  def dispatch_fn(state, data):
    sent = distributor.next(state.distributor, state.global_model_weights)
    outputs = tff.federated_map(train, (sent.result, data))
    return _replaced(state, distributor=sent.state), sent.measurements, outputs

  return (tff.templates.IterativeProcess(init_fn, next_fn),
          tff.templates.IterativeProcess(init_fn, dispatch_fn))


def _replaced(state, **changed):
  """The server's `LearningAlgorithmState` (federated) with the `changed` parts."""
  kind = tff.learning.templates.LearningAlgorithmState
  parts = {name: getattr(state, name) for name in kind._fields}
  return tff.federated_zip(kind(**{**parts, **changed}))


def scale_update(update, factor):
  """`factor` x every tensor of `update` (a tuple), in the update's dtype."""
  return tuple(tf.cast(factor, u.dtype) * u for u in update)
