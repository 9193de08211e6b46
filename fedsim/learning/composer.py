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
  `ModelWeights`. `measurements` is an OrderedDict keyed by stage name. When
  `client_work.next` also takes client states (stateful clients), the process
  is `next(state, client_data, client_states) -> (state, measurements,
  new_client_states)`, the last placed at CLIENTS.
  """

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        global_model_weights=tff.federated_eval(initial_weights_fn, tff.SERVER),
        distributor=distributor.initialize(),
        client_work=client_work.initialize(),
        aggregator=aggregator.initialize(),
        finalizer=finalizer.initialize()))

  work_params = client_work.next.type_signature.parameter
  data_type = work_params[2]
  stateful = len(work_params) == 4

  def round_fn(state, client_data, client_states=None):
    sent = distributor.next(state.distributor, state.global_model_weights)
    if stateful:
      work = client_work.next(state.client_work, sent.result, client_data, client_states)
      result, new_client_states = work.result[0], work.result[1]
    else:
      work = client_work.next(state.client_work, sent.result, client_data)
      result, new_client_states = work.result, None
    aggregated = aggregator.next(state.aggregator, result.update, result.update_weight)
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
    return new_state, measurements, new_client_states

  if not stateful:
    @tff.federated_computation(init_fn.type_signature.result, data_type)
    def next_fn(state, client_data):
      new_state, measurements, _ = round_fn(state, client_data)
      return new_state, measurements

    return tff.templates.IterativeProcess(init_fn, next_fn)

  @tff.federated_computation(init_fn.type_signature.result, data_type, work_params[3])
  def stateful_next_fn(state, client_data, client_states):
    return round_fn(state, client_data, client_states)

  return tff.templates.IterativeProcess(init_fn, stateful_next_fn)


# The field under which `runtime_view` hands the new client states to its runtime.
NEW_CLIENT_STATES = "fedsim_new_client_states"


def sizing_view(process: tff.templates.IterativeProcess) -> tff.templates.IterativeProcess:
  """The same round as a two-argument process that TFF can compile to a MapReduceForm.

  A MapReduceForm takes (server state, client data) and returns only
  server-placed values, so client state enters as part of the client data and
  the new client states (which never leave the clients) are not returned.
  """
  return _paired_view(process, keep_states=False)


def runtime_view(process: tff.templates.IterativeProcess) -> tff.templates.IterativeProcess:
  """`sizing_view` that also carries the new client states out, for a compiling runtime.

  A MapReduceForm's client work returns only what is aggregated, so each
  client's new state is summed under the field `NEW_CLIENT_STATES`: that
  element of `work`'s result is the client's own new state, which a runtime
  that runs `work` per client keeps (and drops the sum). The result is
  `(new_state, (measurements, summed states))`. Never sized: the states do
  not cross the wire.
  """
  return _paired_view(process, keep_states=True)


def _paired_view(process, keep_states: bool) -> tff.templates.IterativeProcess:
  params = process.next.type_signature.parameter
  if len(params) == 2:
    return process
  data_type, states_type = params[1].member, params[2].member
  pair_type = tff.StructType([data_type, states_type])

  @tff.tensorflow.computation(pair_type)
  def first(pair):
    return pair[0]

  @tff.tensorflow.computation(pair_type)
  def second(pair):
    return pair[1]

  @tff.tensorflow.computation(states_type)
  def marked(client_state):
    return collections.OrderedDict([(NEW_CLIENT_STATES, client_state)])

  @tff.federated_computation(params[0], tff.FederatedType(pair_type, tff.CLIENTS))
  def next_fn(state, pairs):
    new_state, measurements, new_states = process.next(
        state, tff.federated_map(first, pairs), tff.federated_map(second, pairs))
    if keep_states:
      return new_state, (measurements, tff.federated_sum(tff.federated_map(marked, new_states)))
    return new_state, measurements

  return tff.templates.IterativeProcess(process.initialize, next_fn)
