"""Federated averaging (McMahan et al. 2017, "Communication-Efficient Learning
of Deep Networks from Decentralized Data"), with server optimizers as in
Reddi et al. 2021 ("Adaptive Federated Optimization").

Each sampled client i starts from the global model w and runs local training
(E epochs or a fixed number of steps) to w_i. With client weights n_i (its
examples processed, or 1 for uniform weighting) the server forms
    Delta = sum_i n_i (w - w_i) / sum_i n_i,    w <- ServerOpt(w, Delta),
which for server SGD with learning rate 1 is the weighted mean of the w_i.

`client_optimizer_state: keep` follows coMind's FedAvg, whose
workers keep their optimizer slots across averaging intervals: each client
keeps its optimizer state (momentum, Adam's moments and step) across the
rounds it takes part in, on disk as client state. `reset` (the default, as
McMahan et al. and TFF) starts the client optimizer fresh every round.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from fedsim.algorithms import ALGORITHMS, ClientPlan, ClientRule, FederatedAlgorithm, Task
from fedsim.algorithms.accumulation import GradientAccumulation, accumulation_field
from fedsim.config.typed import Component, bounded, component
from fedsim.learning.optimizers import OPTIMIZERS, build_optimizer


@dataclasses.dataclass(frozen=True)
class FedAvgParams:
  client_optimizer: Component = component(OPTIMIZERS, {"name": "sgd", "learning_rate": 0.1})
  server_optimizer: Component = component(OPTIMIZERS, {"name": "sgd", "learning_rate": 1.0})
  local_steps: int | None = bounded(None, min=1)  # overrides data.epochs when set
  client_weighting: Literal["num_examples", "uniform"] = "num_examples"
  client_optimizer_state: Literal["reset", "keep"] = "reset"
  gradient_accumulation: GradientAccumulation = accumulation_field()

  def aggregation_kind(self) -> str:
    return "weighted_mean" if self.client_weighting == "num_examples" else "mean"


@ALGORITHMS.register("fedavg", params=FedAvgParams,
                     traits={"model_delta_upload": True, "clients_keep_state": True})
def build_fedavg(params: FedAvgParams, task: Task) -> FederatedAlgorithm:
  """Federated averaging with client and server optimizers."""
  return build_model_averaging(params, task)


def build_model_averaging(params: FedAvgParams, task: Task,
                          extra_gradient=None) -> FederatedAlgorithm:
  """FedAvg's composition; `extra_gradient(received weights) -> (weights ->
  gradient)` adds a term to the clients' local objective (FedProx)."""
  from fedsim.learning import stages
  from fedsim.learning.model_delta import model_delta_client_work
  optimizer = build_optimizer(params.client_optimizer)
  uniform = params.client_weighting == "uniform"
  work = model_delta_client_work(
      task, optimizer, uniform_weighting=uniform,
      accumulation=params.gradient_accumulation.for_training(),
      keep_optimizer_state=params.client_optimizer_state == "keep",
      extra_gradient=extra_gradient)
  return stages.compose_model_update_algorithm(
      task, work,
      server_optimizer=build_optimizer(params.server_optimizer),
      aggregation=params.aggregation_kind(),
      client_plan=ClientPlan(epochs=task.epochs, steps=params.local_steps),
      # Accumulated gradients are a rule of their own: no client rule for them.
      client_rule=(ClientRule("local_training", task, uniform, optimizer, extra_gradient)
                   if params.gradient_accumulation == GradientAccumulation() else None))
