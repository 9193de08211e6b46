"""The `local` runtime's round: TFF's own process behind the runtime contract.

TFF's runtime (its C++ worker, `fedsim.runtime.worker_binary`) runs a whole
`IterativeProcess.next` or nothing, so this round has no phases; it takes the
clients as one list, packing every client of the round at once.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow_federated as tff

from fedsim.runtime import carried_states
from fedsim.runtime.contract import RoundProcess


class TffProcess(RoundProcess):
  """`process` run by TFF's current execution context (fedsim's worker in a run)."""

  def __init__(self, process: tff.templates.IterativeProcess):
    self.process = process
    self._stateful = carried_states.client_state_type(process) is not None
    self._outputs = carried_states.client_output_type(process) is not None

  @property
  def stateful_clients(self) -> bool:
    return self._stateful

  @property
  def client_outputs(self) -> bool:
    return self._outputs

  def initialize(self) -> Any:
    return self.process.initialize()

  def next(self, state: Any, clients: Sequence[Any],
           client_states: Sequence[Any] | None = None) -> tuple[Any, ...]:
    carried_states.check_states(client_states, len(clients), self._stateful)
    if client_states is None:
      return self.process.next(state, list(clients))
    return self.process.next(state, list(clients), list(client_states))
