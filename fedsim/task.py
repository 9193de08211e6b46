"""The types that connect an experiment to an algorithm (base layer: imports nothing of fedsim).

An algorithm entry is `build(params, task: Task) -> FederatedAlgorithm`: the
task says what to build for (the model, how clients batch their data, the
aggregation and broadcast chains), the result is the TFF process plus what
the run loop needs around it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class ClientPlan:
  """How the run loop packs each sampled client's data for one round."""

  epochs: int = 1            # passes over the client's data
  steps: int | None = None   # exactly this many batches instead (cycling), if set


@dataclasses.dataclass(frozen=True)
class Task:
  """What an algorithm is built for."""

  model: Any                       # fedsim.models.functional.TaskModel
  batch_size: int
  epochs: int                      # data.epochs
  aggregation: tuple = ()          # parsed aggregation stages, outermost first
  broadcast: tuple = ()            # parsed broadcast stages (at most one)
  clients_per_round: int = 1       # expected aggregated clients (DP means divide by it)
  num_clients: int = 0             # clients in the population (0: unknown)
  seed: int = 0                    # the run seed: stages derive their randomness from it


@dataclasses.dataclass(frozen=True)
class ClientRule:
  """What every client of a synchronous, stateless round computes, in terms a
  runtime can re-express (`fedsim.runtime.lockstep` trains a round's clients
  together from it); the process computes the same.

  `kind` 'local_training': each non-empty batch is one `optimizer` step from
  the received weights (plus `extra_gradient(received)(weights)` on every
  batch gradient), and the client sends received - trained; 'gradient': the
  gradient of the mean loss over all its batches at the received weights.
  `rebuild(work)` is the same algorithm (broadcast, aggregation chain, server
  optimizer) around another `ClientWork`.
  """

  kind: str
  task: Any
  uniform_weighting: bool
  optimizer: Any = None
  extra_gradient: Callable | None = None
  rebuild: Callable[[Any], "FederatedAlgorithm"] | None = None  # set by the composer


@dataclasses.dataclass(frozen=True)
class FederatedAlgorithm:
  """A built algorithm, the round plan a runtime compiles: the TFF process of its
  composed stages, the state each client starts from and its schedule, and what the run
  loop needs around them (client packing, sizing, measurement names)."""

  # 'synchronous': each round trains the sampled clients on one model and
  # aggregates them; 'buffered' (fedsim.learning.buffered): updates on a clock.
  schedule = "synchronous"

  process: Any        # tff.templates.IterativeProcess: next(state, client_data)
  client_plan: ClientPlan
  # TFF types of what each client uploads besides the model update (summed
  # metrics, update weight): sizing splits the upload into model vs. rest.
  upload_extras_types: tuple = ()
  # The round as TFF compiles it for sizing (see composer.sizing_view).
  sizing_process: Any = None
  # Stateful clients (elastic averaging): what a client starts from, or None.
  initial_client_state: Any = None
  # ((stage name, inner measurement key), ...) of the aggregation chain, top
  # down: how the aggregator's nested measurements are named in metrics.
  aggregation_plan: tuple = ()
  # What each client computes, for runtimes that re-express it (None: they
  # can only run `process`).
  client_rule: ClientRule | None = dataclasses.field(default=None, compare=False)

  @property
  def stateful_clients(self) -> bool:
    return self.initial_client_state is not None

  def model_weights(self, state) -> Any:
    """The model that is evaluated, checkpointed and exported."""
    return state.global_model_weights

