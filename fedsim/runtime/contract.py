"""The runtime contract: what every runtime's round object does (TF-free).

A runtime (`fedsim.runtime.runtime_registry.Runtime`) compiles a built algorithm's
round into a `RoundProcess`, and the run loop calls nothing else:

    state = process.initialize()
    state, measurements = process.next(state, clients)
    state, measurements, outputs = process.next(state, clients, client_states)
    process.close()

`clients` is a sequence of packed clients (`fedsim.experiment.round_clients.
RoundClients` reads them lazily; a runtime that needs them all at once makes a
list). The third result, `outputs`, one per client in order, is there when
`client_outputs` is True: the new states of clients that keep state
(`stateful_clients`: `next` then takes their states, one per client), or what
each client of a buffered algorithm's dispatch trained. Structures are TFF's
Python ones, as the algorithm's TFF process takes and returns them.

A runtime that can split a round into the phases of its MapReduceForm gives
them as `phases` (a `RoundPhases`); a round whose clients run different
variants (a controlled encoder parameter, `fedsim.runtime.mixed`) needs them.
TFF's own runtime runs whole rounds only: its `phases` is None.
"""

from __future__ import annotations

import abc
from typing import Any, Sequence


class RoundPhases(abc.ABC):
  """A round in the phases of its MapReduceForm: `start` once, `run_clients` on any
  number of groups of clients (each from the zero accumulator `start` gave),
  `merge` of their accumulators, `finish` once."""

  @abc.abstractmethod
  def start(self, state: Any) -> tuple[Any, Any]:
    """`(client_input, zero accumulator)`: what every client receives, and the
    accumulator of no client."""

  @abc.abstractmethod
  def run_clients(self, client_input: Any, acc: Any, clients: Sequence[Any],
                  client_states: Sequence[Any] | None = None) -> Any:
    """`acc` with every client of `clients` worked and accumulated, in order; with
    per-client outputs (see `RoundProcess.client_outputs`), `(acc, outputs)`."""

  @abc.abstractmethod
  def merge(self, first: Any, second: Any) -> Any:
    """The accumulator of two groups' accumulators."""

  @abc.abstractmethod
  def finish(self, state: Any, acc: Any, outputs: Sequence[Any] | None = None) -> tuple[Any, ...]:
    """What `RoundProcess.next` returns, from the round's merged accumulator
    (and the per-client outputs of all groups, in order, when it has them)."""


class RoundProcess(abc.ABC):
  """A runtime's round: what `Runtime.build` returns (see the module docstring).

  Subclasses implement `initialize`, `next` and `stateful_clients`; `phases`,
  `client_outputs` and `close` have defaults (no phases, outputs exactly when
  the clients keep state, nothing to release).
  """

  @abc.abstractmethod
  def initialize(self) -> Any:
    """The initial server state."""

  @abc.abstractmethod
  def next(self, state: Any, clients: Sequence[Any],
           client_states: Sequence[Any] | None = None) -> tuple[Any, ...]:
    """One round: `(new_state, measurements)`, plus the per-client outputs third
    when `client_outputs`.

    Raises:
      ValueError: `client_states` given for stateless clients, or missing (or
        not one per client) for stateful ones.
      RunFailed: the runtime died (e.g. a lost cluster).
    """

  @property
  @abc.abstractmethod
  def stateful_clients(self) -> bool:
    """Whether `next` takes the clients' states (and returns their new ones)."""

  @property
  def client_outputs(self) -> bool:
    """Whether `next` returns a third element, one value per client."""
    return self.stateful_clients

  @property
  def phases(self) -> RoundPhases | None:
    """The round's phases, or None for a runtime that runs whole rounds only."""
    return None

  def close(self) -> None:
    """Releases what the runtime holds (e.g. cluster workers); idempotent."""
