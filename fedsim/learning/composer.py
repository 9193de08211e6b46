"""Joins the four stages of a federated algorithm into one TFF process.

distributor (server -> clients) -> client work -> aggregator (clients ->
server) -> finalizer (server update), as in TFF's `compose_learning_process`,
whose type checks insist on tf.data client data. State is TFF's
`LearningAlgorithmState`; measurements are nested by stage. The process
contains a single aggregation phase, so TFF can compile it to a
MapReduceForm, which is where communication sizes are read from.
"""

from __future__ import annotations

import collections

import tensorflow_federated as tff


def compose(initial_weights_fn: tff.Computation,
            distributor: tff.templates.MeasuredProcess,
            client_work: tff.templates.MeasuredProcess,
            aggregator: tff.templates.AggregationProcess,
            finalizer: tff.templates.MeasuredProcess) -> tff.templates.IterativeProcess:
  """Returns an `IterativeProcess`: `next(state, client_data) -> (state, measurements)`.

  `initial_weights_fn` is a no-arg TF computation returning the initial
  `ModelWeights`. `measurements` is an OrderedDict keyed by stage name.
  """

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=tff.federated_eval(initial_weights_fn, tff.SERVER),
        distributor=distributor.initialize(),
        client_work=client_work.initialize(),
        aggregator=aggregator.initialize(),
        finalizer=finalizer.initialize()))

  data_type = client_work.next.type_signature.parameter[2]

  @tff.federated_computation(init_fn.type_signature.result, data_type)
  def next_fn(state, client_data):
    sent = distributor.next(state.distributor, state.global_model_weights)
    work = client_work.next(state.client_work, sent.result, client_data)
    aggregated = aggregator.next(
        state.aggregator, work.result.update, work.result.update_weight)
    finished = finalizer.next(
        state.finalizer, state.global_model_weights, aggregated.result)
    new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=finished.result,
        distributor=sent.state,
        client_work=work.state,
        aggregator=aggregated.state,
        finalizer=finished.state))
    measurements = tff.federated_zip(collections.OrderedDict(
        distributor=sent.measurements,
        client_work=work.measurements,
        aggregator=aggregated.measurements,
        finalizer=finished.measurements))
    return new_state, measurements

  return tff.templates.IterativeProcess(init_fn, next_fn)
