"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich & Suresh 2020, "SCAFFOLD:
Stochastic Controlled Averaging for Federated Learning"), option II.

The server keeps the model x and a control variate c; each client i keeps its
own control variate c_i (client state on disk, zero before its first round).
A sampled client starts from y = x and takes K local SGD steps with the
drift-corrected gradient
    y <- y - lr_l (g_i(y) - c_i + c),
then sets (option II)  c_i+ = c_i - c + (x - y) / (K lr_l)  and sends
(Delta y = y - x, Delta c_i = c_i+ - c_i). With S the clients that reported
and N the population,
    x <- x + lr_g mean_{i in S} Delta y_i,    c <- c + (1/N) sum_{i in S} Delta c_i.
Delta y travels as the model update through the aggregation chain (so it is
compressed, clipped, ...; `client_weighting: num_examples` weighs it by
examples); Delta c is a plain float sum outside the chain, and c is sent to
the clients unencoded with the model, so SCAFFOLD moves twice the model
each way (sized from the compiled round). c is server state, checkpointed.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Literal

from fedsim.algorithms import ALGORITHMS, ClientPlan, FederatedAlgorithm, Task
from fedsim.config.typed import Component, bounded, component
from fedsim.errors import UserError
from fedsim.learning.optimizers import OPTIMIZERS, build_optimizer


@dataclasses.dataclass(frozen=True)
class ScaffoldParams:
  client_learning_rate: float = bounded(0.1, gt=0)   # lr_l: local SGD, as in the paper
  server_optimizer: Component = component(OPTIMIZERS, {"name": "sgd", "learning_rate": 1.0})
  local_steps: int | None = bounded(None, min=1)     # K; None: data.epochs passes
  client_weighting: Literal["uniform", "num_examples"] = "uniform"  # the paper: uniform

  def aggregation_kind(self) -> str:
    return "mean" if self.client_weighting == "uniform" else "weighted_mean"


@ALGORITHMS.register("scaffold", params=ScaffoldParams,
                     traits={"model_delta_upload": False, "clients_keep_state": True})
def build_scaffold(params: ScaffoldParams, task: Task) -> FederatedAlgorithm:
  """SCAFFOLD with option II control variates (client ones kept on disk).

  Raises:
    UserError: the population size is unknown (the server's control variate
      moves by the sum of the reported changes over N).
  """
  if task.num_clients < 1:
    raise UserError("algorithm.name: scaffold needs the number of clients in the population")
  import numpy as np
  import tensorflow as tf
  import tensorflow_federated as tff

  from fedsim.learning import client_work, local_training, stages

  lr = params.client_learning_rate
  population = float(task.num_clients)
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=lr)
  trainable = task.model.initial_weights.trainable
  specs = tuple(tf.TensorSpec(w.shape, tf.float32) for w in trainable)
  zeros = tuple(np.zeros_like(w) for w in trainable)
  uniform = params.client_weighting == "uniform"

  def update_fn(model_weights, batches, client_state, c):
    x = tuple(model_weights.trainable)
    c_i = tuple(client_state["control_variate"])
    correction = tuple(s - own for s, own in zip(c, c_i))
    result = local_training.train(
        task.model.predict, sgd, x, sgd.initialize(specs), batches,
        extra_gradient=lambda weights: correction, pad_label=task.model.pad_label)
    update = tuple(start - y for start, y in zip(x, result.weights))
    # Option II as a change: Delta c_i = c_i+ - c_i = (x - y) / (K lr_l) - c, none for
    # a client without a step. Each line is a pass over the model, which on small
    # batches costs more than the arithmetic: x - y is computed once, and the
    # client without a step takes a branch of its own rather than a mask.
    def changed():
      scale = 1.0 / (result.steps * lr)
      return tuple(scale * u - s for u, s in zip(update, c))

    delta_c = tf.cond(result.steps > 0, changed, lambda: tuple(tf.zeros_like(s) for s in c))
    new_c_i = tuple(own + d for own, d in zip(c_i, delta_c))
    weight = tf.constant(1.0) if uniform else result.stats.num_examples
    return (update, weight, result.stats,
            collections.OrderedDict(control_variate=new_c_i), delta_c)

  def update_server_variate(c, summed_delta_c):
    return tuple(s + d / population for s, d in zip(c, summed_delta_c))

  work = client_work.build_stateful_client_work(
      task.model.weights_type, task.model.client_data_type(task.batch_size),
      collections.OrderedDict(control_variate=zeros), update_fn,
      shared=client_work.SharedState(zeros, update_server_variate))
  return stages.compose_model_update_algorithm(
      task, work,
      server_optimizer=build_optimizer(params.server_optimizer),
      aggregation=params.aggregation_kind(),
      client_plan=ClientPlan(epochs=task.epochs, steps=params.local_steps))
