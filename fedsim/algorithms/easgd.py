"""Elastic averaging SGD (Zhang, Choromanska & LeCun 2015, "Deep learning
with Elastic Averaging SGD"), federated.

Each client i keeps its own model x_i (and its optimizer's state) across the
rounds it takes part in, starting from the center x~ the first time. In a
round, a sampled client receives x~ and runs tau = `communication_period`
local steps on x_i with the elastic term added to its gradient,
    g <- g + rho (x_i - x~),
then with d_i = x_i - x~ and alpha = `moving_rate` it sets
    x_i <- x_i - alpha d_i   and sends alpha d_i,
and the server moves the center by the sum over the clients that reported:
    x~ <- x~ + sum_i alpha d_i.
The center is the model that is evaluated, checkpointed and exported; the
local models are client state (kept on disk by the run loop).

Defaults follow TensorFlow's `ElasticAverageOptimizer`:
    alpha = 0.9 / tau / p,   rho = alpha / (client learning rate),
with p the number of workers, here `clients_per_round` (the clients whose
moves sum into the center each round): p alpha = 0.9 / tau, the paper's
beta = p alpha = 0.9 divided by TF's communication period, and the elastic
pull per local step, lr rho, equals alpha. The pull in local steps is toward
the center the client received this round (in TF: the copy of the center it
read at its last communication).
"""

from __future__ import annotations

import collections
import dataclasses

from fedsim.algorithms import ALGORITHMS, ClientPlan, FederatedAlgorithm, Task
from fedsim.algorithms.accumulation import GradientAccumulation, accumulation_field
from fedsim.config.typed import Component, bounded, component
from fedsim.errors import UserError
from fedsim.learning.optimizers import OPTIMIZERS, build_optimizer


@dataclasses.dataclass(frozen=True)
class EasgdParams:
  client_optimizer: Component = component(OPTIMIZERS, {"name": "sgd", "learning_rate": 0.1})
  moving_rate: float | None = bounded(None, gt=0, max=1)  # alpha; None: 0.9 / tau / p
  rho: float | None = bounded(None, min=0)      # elastic strength; None: alpha / client lr
  communication_period: int = bounded(10, min=1)      # tau: local steps per round
  gradient_accumulation: GradientAccumulation = accumulation_field()

  def aggregation_kind(self) -> str:
    return "sum"  # the center moves by the sum of the clients' elastic differences

  def resolved(self, clients_per_round: int) -> tuple[float, float]:
    """(moving_rate, rho), TF's `ElasticAverageOptimizer` defaults where unset.

    Raises:
      UserError: rho is unset and the client optimizer has no learning_rate.
    """
    alpha = (self.moving_rate if self.moving_rate is not None
             else 0.9 / self.communication_period / max(clients_per_round, 1))
    if self.rho is not None:
      return alpha, self.rho
    learning_rate = getattr(self.client_optimizer.params, "learning_rate", None)
    if not learning_rate:
      raise UserError(f"algorithm.rho: its default is moving_rate / the client learning"
                      f" rate, but optimizer '{self.client_optimizer.name}' has none; set rho")
    return alpha, alpha / learning_rate


@ALGORITHMS.register("easgd", params=EasgdParams,
                     traits={"model_delta_upload": False, "clients_keep_state": True})
def build_easgd(params: EasgdParams, task: Task) -> FederatedAlgorithm:
  """Elastic averaging SGD with clients that keep their local models."""
  import numpy as np
  import tensorflow as tf
  import tensorflow_federated as tff

  from fedsim.learning import client_work, local_training, stages
  from fedsim.learning.optimizers import state_as_arrays, stored_or_initial

  optimizer = build_optimizer(params.client_optimizer)
  trainable = task.model.initial_weights.trainable
  specs = tuple(tf.TensorSpec(w.shape, tf.float32) for w in trainable)
  accumulation = params.gradient_accumulation.for_training()
  initial_client_state = collections.OrderedDict(
      initialized=np.float32(0.0),
      weights=tuple(np.zeros_like(w) for w in trainable),
      optimizer_state=state_as_arrays(optimizer, specs))
  if accumulation.carry:
    initial_client_state["window"] = client_work.empty_window_arrays(trainable)
  predict = task.model.predict
  alpha, rho = params.resolved(task.clients_per_round)

  def update_fn(model_weights, batches, client_state):
    center = tuple(model_weights.trainable)
    seen = client_state["initialized"] > 0
    local = tuple(tf.where(seen, w, c) for w, c in zip(client_state["weights"], center))
    fresh = tf.nest.map_structure(tf.convert_to_tensor, optimizer.initialize(specs))
    opt_state = stored_or_initial(seen, client_state["optimizer_state"], fresh)

    def elastic(weights):
      return tuple(rho * (w - c) for w, c in zip(weights, center))

    result = local_training.train(
        predict, optimizer, local, opt_state, batches, accumulation,
        extra_gradient=elastic if rho > 0 else None, pad_label=task.model.pad_label,
        window=client_state["window"] if accumulation.carry else None)
    diff = tuple(t - c for t, c in zip(result.weights, center))
    new_state = collections.OrderedDict(
        initialized=tf.constant(1.0),
        weights=tuple(t - alpha * d for t, d in zip(result.weights, diff)),
        optimizer_state=result.optimizer_state)
    if accumulation.carry:
      new_state["window"] = client_work.window_state(result.window)
    # The server applies `center - 1.0 * update`, so the update is -alpha d_i.
    update = tuple(-alpha * d for d in diff)
    return update, tf.constant(1.0), result.stats, new_state

  work = client_work.build_stateful_client_work(
      task.model.weights_type, task.model.client_data_type(task.batch_size),
      initial_client_state, update_fn)
  return stages.compose_model_update_algorithm(
      task, work, server_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
      aggregation=params.aggregation_kind(),
      client_plan=ClientPlan(steps=params.communication_period))
