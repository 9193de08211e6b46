"""Buffered asynchronous aggregation, FedBuff (Nguyen et al. 2022, "Federated
Learning with Buffered Asynchronous Aggregation").

`concurrency` clients train at any time, each on the model version x_{v_i} it
downloaded when it was dispatched, and send Delta_i = x_{v_i} - x_i (after local
training). The server buffers arrivals; an arrival with staleness
s_i = (current version) - v_i above `max_staleness` is dropped. When
K = `clients_per_round` updates are buffered, the server applies, as the paper's
Algorithm 1 does (`normalize: buffer_size`),
    Delta = (1/K) sum_i w(s_i) Delta_i,                 x <- ServerOpt(x, Delta),
or, with `normalize: total_weight`, the weighted mean with weights w(s_i) n_i
(n_i = examples, or 1 with uniform client weighting),
    Delta = sum_i w(s_i) n_i Delta_i / sum_i w(s_i) n_i,
which with no staleness is FedAvg's update. w is a `staleness` entry
(constant, sqrt = 1/sqrt(1+s), polynomial (1+s)^-a). The simulated clock that
decides arrival order lives in `fedsim/experiment/async_loop.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from fedsim.algorithms import ALGORITHMS, ClientPlan, FederatedAlgorithm, Task
from fedsim.algorithms.staleness import STALENESS
from fedsim.config.typed import Component, bounded, component
from fedsim.control.engine import check_schedule, find_controlled
from fedsim.errors import UserError
from fedsim.learning.optimizers import OPTIMIZERS, build_optimizer


@dataclasses.dataclass(frozen=True)
class FedBuffParams:
  client_optimizer: Component = component(OPTIMIZERS, {"name": "sgd", "learning_rate": 0.1})
  server_optimizer: Component = component(OPTIMIZERS, {"name": "sgd", "learning_rate": 1.0})
  local_steps: int | None = bounded(None, min=1)  # overrides data.epochs when set
  # Clients training at once (None: clients_per_round, the buffer size K).
  concurrency: int | None = bounded(None, min=1)
  max_staleness: int | None = bounded(None, min=0)  # staler arrivals are dropped
  staleness: Component = component(STALENESS, {"name": "sqrt"})
  client_weighting: Literal["uniform", "num_examples"] = "uniform"
  normalize: Literal["buffer_size", "total_weight"] = "buffer_size"

  def aggregation_kind(self) -> str:
    return "mean" if self.normalize == "buffer_size" else "weighted_mean"

  def check_experiment(self, config) -> None:
    """Refuses the experiment keys of synchronous rounds, which buffered
    server updates cannot honour (`fedsim validate` calls it too).

    Raises:
      UserError: naming the key.
    """
    num_clients = getattr(config.data.params, "num_clients", None)
    if self.concurrency is not None and num_clients is not None and self.concurrency > num_clients:
      raise UserError(f"algorithm.concurrency: {self.concurrency} clients in flight, but"
                      f" data.num_clients is {num_clients}")
    if config.backup_clients:
      raise UserError("backup_clients: not used by asynchronous algorithms"
                      " (algorithm.concurrency sets how many clients train at once)")
    if config.sampling != "fixed":
      raise UserError(f"sampling: {config.sampling} is not used by asynchronous algorithms"
                      " (each refill draws algorithm.concurrency clients)")
    if config.system.deadline_seconds is not None:
      raise UserError("system.deadline_seconds: not used by asynchronous algorithms"
                      " (algorithm.max_staleness drops late updates)")
    check_schedule(find_controlled({"aggregation": config.aggregation_chain(),
                                    "broadcast": config.broadcast_chain()}),
                   "buffered", "fedbuff")   # its build's schedule (learning.buffered)
    # Every server update applies exactly K = clients_per_round buffered
    # reports, so no update ever has fewer than min_clients: the key is inert.
    if config.system.min_clients != 1:
      raise UserError(f"system.min_clients: not used by asynchronous algorithms (every"
                      f" server update aggregates clients_per_round = {config.clients_per_round}"
                      " buffered updates); leave it at 1")


@ALGORITHMS.register("fedbuff", params=FedBuffParams,
                     traits={"model_delta_upload": True, "clients_keep_state": False})
def build_fedbuff(params: FedBuffParams, task: Task) -> FederatedAlgorithm:
  """Buffered asynchronous aggregation with staleness weights (runs on the simulated clock).

  Raises:
    UserError: `client_weighting: num_examples` with `normalize: buffer_size`.
  """
  if params.client_weighting == "num_examples" and params.normalize == "buffer_size":
    raise UserError("algorithm.client_weighting: num_examples needs normalize: total_weight"
                    " (normalize: buffer_size divides by K, as FedBuff does)")
  from fedsim.learning import buffered, stages
  from fedsim.learning.model_delta import model_delta_client_work
  import tensorflow_federated as tff
  work = model_delta_client_work(
      task, build_optimizer(params.client_optimizer),
      uniform_weighting=params.client_weighting == "uniform")
  server_optimizer = build_optimizer(params.server_optimizer)
  kind = params.aggregation_kind()
  plan = ClientPlan(epochs=task.epochs, steps=params.local_steps)
  # The synchronous round of the same stages: what one client downloads and uploads.
  # Buffered rounds run the stateless `work.client_fn`: its clients keep no state.
  sync = stages.compose_model_update_algorithm(task, work, server_optimizer, kind, plan,
                                               keeps_client_state=False)
  weight_of = STALENESS.get(params.staleness.name).build
  staleness_params = params.staleness.params

  def weigh(update, update_weight, staleness):
    w = weight_of(staleness_params, staleness)
    if params.normalize == "buffer_size":
      return buffered.scale_update(update, w), update_weight
    return update, w * update_weight

  result_type = work.client_fn.type_signature.result[0]
  aggregator, _ = stages.update_aggregator(task, result_type.update, kind)
  distributor = stages.distributor(task)
  process, dispatch_process = buffered.compose_buffered(
      stages.initial_weights_computation(task), distributor, work.client_fn,
      work.finalize_metrics, weigh, aggregator,
      tff.learning.templates.build_apply_optimizer_finalizer(
          server_optimizer, task.model.weights_type))
  return buffered.BufferedAlgorithm(
      process=process, client_plan=plan, upload_extras_types=sync.upload_extras_types,
      sizing_process=sync.sizing_process, aggregation_plan=sync.aggregation_plan,
      dispatch_process=dispatch_process,
      concurrency=params.concurrency,
      max_staleness=params.max_staleness)
