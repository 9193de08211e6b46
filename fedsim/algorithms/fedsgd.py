"""Synchronous replicas / federated SGD (Chen et al. 2016, "Revisiting
Distributed Synchronous SGD"; McMahan et al. 2017's FedSGD baseline).

Every participating client i computes the gradient g_i of its mean loss at the
global model w over its batches (all its data, or `batches_per_round`
batches); the server averages them, weighted by examples n_i, and takes one
optimizer step:
    g = sum_i n_i g_i / sum_i n_i,    w <- ServerOpt(w, g).
With example weighting this is one step of centralized SGD on the union of the
clients' batches. Updates of clients that finish late are dropped (backup
clients), which is how synchronous replicas discard stale gradients.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from fedsim.algorithms import ALGORITHMS, ClientPlan, ClientRule, FederatedAlgorithm, Task
from fedsim.config.typed import Component, bounded, component
from fedsim.learning.optimizers import OPTIMIZERS, build_optimizer


@dataclasses.dataclass(frozen=True)
class FedSgdParams:
  server_optimizer: Component = component(OPTIMIZERS, {"name": "sgd", "learning_rate": 0.1})
  batches_per_round: int | None = bounded(None, min=1)  # None: one pass over the client's data
  client_weighting: Literal["num_examples", "uniform"] = "num_examples"

  def aggregation_kind(self) -> str:
    return "weighted_mean" if self.client_weighting == "num_examples" else "mean"


@ALGORITHMS.register("fedsgd", params=FedSgdParams,
                     traits={"model_delta_upload": True, "clients_keep_state": True})
def build_fedsgd(params: FedSgdParams, task: Task) -> FederatedAlgorithm:
  """Federated SGD: clients send gradients, the server averages and applies them."""
  import tensorflow as tf

  from fedsim.learning import client_work, local_training, stages

  predict = task.model.predict
  uniform = params.client_weighting == "uniform"

  def update_fn(model_weights, batches):
    grads, stats = local_training.gradient(predict, tuple(model_weights.trainable), batches,
                                           task.model.pad_label)
    weight = tf.constant(1.0) if uniform else stats.num_examples
    return grads, weight, stats

  # A gradient is the model change of one SGD step at rate 1, in the weights' units.
  work = client_work.build_client_work(
      task.model.weights_type, task.model.client_data_type(task.batch_size), update_fn,
      model_delta=True)
  return stages.compose_model_update_algorithm(
      task, work,
      server_optimizer=build_optimizer(params.server_optimizer),
      aggregation=params.aggregation_kind(),
      client_plan=ClientPlan(epochs=1, steps=params.batches_per_round),
      client_rule=ClientRule("gradient", task, uniform))
