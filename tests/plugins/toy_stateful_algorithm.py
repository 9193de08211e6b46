"""A stateful algorithm plugin, one file: FedAvg whose clients keep momentum across rounds.

    client k, round t:  m_k <- Delta_k + beta m_k;  sends m_k;   server: FedAvg's mean.

Delta_k is the client's FedAvg update (received - trained weights). m_k is client
state: zero for a new client, kept by the run loop between the rounds the client
takes part in (on disk past `runtime.client_state_memory_mb`), checkpointed and
resumed with the run. Named in a config as `algorithm: {name: client_momentum,
beta: 0.5}` after `plugins: [toy_stateful_algorithm.py]`.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from fedsim.algorithms import ALGORITHMS, ClientPlan, FederatedAlgorithm, Task
from fedsim.config.typed import Component, bounded, component
from fedsim.learning.optimizers import OPTIMIZERS, build_optimizer


@dataclasses.dataclass(frozen=True)
class MomentumParams:
  beta: float = bounded(0.5, gt=0, max=1)
  client_optimizer: Component = component(OPTIMIZERS, {"name": "sgd", "learning_rate": 0.1})
  server_optimizer: Component = component(OPTIMIZERS, {"name": "sgd", "learning_rate": 1.0})

  def aggregation_kind(self) -> str:
    return "weighted_mean"


@ALGORITHMS.register("client_momentum", params=MomentumParams)
def build_client_momentum(params: MomentumParams, task: Task) -> FederatedAlgorithm:
  """FedAvg whose clients send their update plus beta times what they sent last (a plugin)."""
  from fedsim.learning import client_work, stages
  from fedsim.learning.model_delta import model_delta_client_work

  delta = model_delta_client_work(task, build_optimizer(params.client_optimizer),
                                  uniform_weighting=False)
  initial = collections.OrderedDict(
      momentum=tuple(np.zeros_like(w) for w in task.model.initial_weights.trainable))

  def client_update(weights, batches, state):
    update, weight, stats = delta.client_update(weights, batches)
    sent = tuple(u + params.beta * m for u, m in zip(update, state["momentum"]))
    return sent, weight, stats, collections.OrderedDict(momentum=sent)

  work = client_work.build_stateful_client_work(
      task.model.weights_type, task.model.client_data_type(task.batch_size), initial,
      client_update)
  return stages.compose_model_update_algorithm(
      task, work, server_optimizer=build_optimizer(params.server_optimizer),
      aggregation=params.aggregation_kind(), client_plan=ClientPlan(epochs=task.epochs))
