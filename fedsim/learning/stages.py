"""Stage builders shared by the algorithms: distributors, client work,
aggregators and finalizers, assembled from `fedsim.learning` pieces.
The task's broadcast chain becomes the distributor and its aggregation chain
the aggregator (see `fedsim.aggregation`): compression, clipping and
differential privacy are stages there, not flags of an algorithm."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.aggregation.chain import build_broadcast, build_chain
from fedsim.errors import UserError
from fedsim.compression import feedback
from fedsim.learning import client_work, composer
from fedsim.task import ClientRule, FederatedAlgorithm


def initial_weights_computation(task) -> tff.Computation:
  initial = task.model.initial_weights

  @tff.tensorflow.computation
  def initial_weights():
    return tff.learning.models.ModelWeights(
        trainable=tuple(tf.constant(w) for w in initial.trainable), non_trainable=())

  return initial_weights


def distributor(task) -> tff.templates.MeasuredProcess:
  """The broadcast of `task.broadcast` (plain when the chain is empty)."""
  return build_broadcast(task.broadcast, task.model.weights_type, task.seed)


def update_aggregator(task, update_type, aggregation: str):
  """Aggregates client updates through `task.aggregation`; returns (process, plan).

  `aggregation` is how the algorithm combines updates: 'weighted_mean', 'mean'
  or 'sum'. Every process has the (state, value, weight) signature, the
  weight unused when unweighted; `plan` names the chain's measurements.
  """
  factory, plan = build_chain(task.aggregation, aggregation, task.clients_per_round, task.seed)
  try:
    if aggregation == "weighted_mean":
      return factory.create(update_type, tff.TensorType(np.float32)), plan
    process = factory.create(update_type)
  except (TypeError, ValueError) as e:
    # A factory (often a user's) that TFF cannot apply to the update: one line.
    names = ", ".join(s.name for s in task.aggregation)
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(f"aggregation: TFF cannot build the chain [{names}] for the model"
                    f" update: {reason}") from None
  return _drop_weight(process), plan


def compose_model_update_algorithm(task, work: client_work.ClientWork, server_optimizer,
                                   aggregation: str, client_plan,
                                   keeps_client_state: bool = True,
                                   client_rule: ClientRule | None = None) -> FederatedAlgorithm:
  """distributor -> `work` -> aggregated updates -> server optimizer step.

  `aggregation`: 'weighted_mean' (by the clients' update weights), 'mean' or
  'sum' of the client updates. Per-client memory the config asks for wraps
  `work` here, outside the algorithm (`feedback.upload_memory`);
  `keeps_client_state=False` says the algorithm's schedule runs its clients
  without state (FedBuff), so such a config is refused. `client_rule`, what
  `work` computes per client, is kept (with its `rebuild`) when the clients
  keep no state.

  Raises:
    UserError: the config asks `work`'s clients for memory they cannot keep.
  """
  memory = feedback.upload_memory(task, work, aggregation, keeps_client_state)
  if memory is not None:
    work = client_work.with_client_memory(
        task.model.weights_type, task.model.client_data_type(task.batch_size), work, memory)
  if client_rule is not None and work.client_state_type is None:
    client_rule = dataclasses.replace(client_rule, rebuild=lambda other: (
        compose_model_update_algorithm(task, other, server_optimizer, aggregation, client_plan,
                                       keeps_client_state)))
  else:
    client_rule = None
  result_type = work.process.next.type_signature.result.result.member
  update_type = (result_type[0] if work.client_state_type is not None else result_type).update
  aggregator, plan = update_aggregator(task, update_type, aggregation)
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, task.model.weights_type)
  process = composer.compose(
      initial_weights_computation(task), distributor(task), work.process, aggregator, finalizer)
  extras = [work.metrics_type] + ([work.weight_type] if aggregation == "weighted_mean" else [])
  return FederatedAlgorithm(process=process, client_plan=client_plan,
                            upload_extras_types=tuple(extras),
                            sizing_process=composer.sizing_view(process),
                            initial_client_state=work.initial_client_state,
                            aggregation_plan=plan, client_rule=client_rule)


def _drop_weight(unweighted: tff.templates.AggregationProcess) -> tff.templates.AggregationProcess:
  """Gives an unweighted aggregation the (state, value, weight) signature."""
  value_type = unweighted.next.type_signature.parameter[1]

  @tff.federated_computation(
      unweighted.next.type_signature.parameter[0], value_type,
      tff.FederatedType(np.float32, tff.CLIENTS))
  def next_fn(state, value, weight):
    del weight
    return unweighted.next(state, value)

  return tff.templates.AggregationProcess(unweighted.initialize, next_fn)
