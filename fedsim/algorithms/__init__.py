"""Federated algorithms by name.

Each entry is a thin `build(params, task) -> FederatedAlgorithm` that
validates its parameters and composes stages (see `fedsim.learning`). Its
module docstring names the paper it follows and its update rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedsim.registry import Registry

ALGORITHMS = Registry("algorithm")


@dataclasses.dataclass(frozen=True)
class ClientPlan:
  """How the run loop packs each sampled client's data for one round."""

  epochs: int = 1            # passes over the client's data
  steps: int | None = None   # exactly this many batches instead (cycling), if set


@dataclasses.dataclass(frozen=True)
class Task:
  """What an algorithm is built for: the model, data shape and compression."""

  model: Any          # fedsim.models.functional.TaskModel
  batch_size: int
  epochs: int         # data.epochs
  compression: Any    # fedsim.compression.CompressionSpec (or None)


@dataclasses.dataclass(frozen=True)
class FederatedAlgorithm:
  """A built algorithm: the TFF process and what the run loop needs around it."""

  process: Any        # tff.templates.IterativeProcess: next(state, client_data)
  client_plan: ClientPlan
  # TFF types of what each client uploads besides the model update (summed
  # metrics, update weight): sizing splits the upload into model vs. rest.
  upload_extras_types: tuple = ()
  # The round as TFF compiles it for sizing (see composer.sizing_view).
  sizing_process: Any = None
  # Stateful clients (elastic averaging): what a client starts from, or None.
  initial_client_state: Any = None

  @property
  def stateful_clients(self) -> bool:
    return self.initial_client_state is not None

  def model_weights(self, state) -> Any:
    """The model that is evaluated, checkpointed and exported."""
    return state.global_model_weights


from fedsim.algorithms import easgd, fedavg, fedsgd  # noqa: E402,F401  (registers)
