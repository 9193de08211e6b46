"""An algorithm plugin, one file: FedAvg whose clients add L2 weight decay to every gradient.

    local step:  w <- w - lr (g(w) + decay w);   server: FedAvg's mean of deltas.

Named in a config as `algorithm: {name: fedavg_decay, decay: 0.01}` after
`plugins: [toy_algorithm.py]`. Its upload is a model delta, so compression,
error feedback and DP stages apply to it from the config, without opting in.
"""

from __future__ import annotations

import dataclasses

from fedsim.algorithms import ALGORITHMS, ClientPlan, FederatedAlgorithm, Task
from fedsim.config.typed import Component, bounded, component
from fedsim.learning.optimizers import OPTIMIZERS, build_optimizer


@dataclasses.dataclass(frozen=True)
class DecayParams:
  decay: float = bounded(0.01, min=0)
  client_optimizer: Component = component(OPTIMIZERS, {"name": "sgd", "learning_rate": 0.1})
  server_optimizer: Component = component(OPTIMIZERS, {"name": "sgd", "learning_rate": 1.0})

  def aggregation_kind(self) -> str:
    return "weighted_mean"


@ALGORITHMS.register("fedavg_decay", params=DecayParams)
def build_fedavg_decay(params: DecayParams, task: Task) -> FederatedAlgorithm:
  """FedAvg with L2 weight decay in the clients' local steps (a plugin's algorithm)."""
  from fedsim.learning import stages
  from fedsim.learning.model_delta import model_delta_client_work

  def decay(received):
    del received
    return lambda weights: tuple(params.decay * w for w in weights)

  work = model_delta_client_work(task, build_optimizer(params.client_optimizer),
                                 uniform_weighting=False, extra_gradient=decay)
  return stages.compose_model_update_algorithm(
      task, work, server_optimizer=build_optimizer(params.server_optimizer),
      aggregation=params.aggregation_kind(), client_plan=ClientPlan(epochs=task.epochs))
