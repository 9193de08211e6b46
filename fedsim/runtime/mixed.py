"""A round as groups of clients, each run by its own compiled round, summed into one update.

A controller may give the clients of one round different encoder parameters
(`fedsim.control.engine`). Each value's algorithm is its own process, but
their MapReduceForms agree on everything the server holds: the state, the
accumulator (what is summed after decoding) and the update. So each group of
clients is worked and accumulated by its own value's round (`start`,
`run_clients`), the groups' accumulators are merged, and the first group's
round finishes (`report` and `update`). A plain round is the one-group case:
its process's `next`. Several groups need a runtime whose rounds have
`phases` (`inprocess`, `ray`); TFF's own runtime runs a whole round or nothing.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from fedsim.errors import UserError
from fedsim.runtime.contract import RoundProcess


class Group(NamedTuple):
  """Clients of one round that one process runs."""

  process: RoundProcess
  clients: Sequence[Any]               # their packed data, in order
  states: Sequence[Any] | None = None  # their states, when the clients keep state


def next_mixed(groups: Sequence[Group], state: Any,
               runtime_name: str = "this runtime") -> tuple[Any, ...]:
  """One round over `groups`, as `RoundProcess.next` returns it.

  Args:
    groups: one per value, in the order the values first appear among the
      round's clients (a plain round: one group).
    state: the server state (of the same type for every process).

  Returns:
    `(new_state, measurements)`, with client states `(new_state,
    measurements, new_client_states)` in `groups`' order, group by group.

  Raises:
    UserError: several groups and a process without phases.
  """
  if len(groups) == 1:
    process, data, states = groups[0]
    return process.next(state, data) if states is None else process.next(state, data, states)
  phases = [process.phases for process, _, _ in groups]
  if any(p is None for p in phases):
    raise UserError(f"runtime.name: {runtime_name} runs one encoder setting per round, and"
                    " the controller gave this round's clients different values; use"
                    " runtime: inprocess")
  acc, new_states = None, []
  stateful = groups[0][2] is not None
  for phase, (_, data, states) in zip(phases, groups):
    client_input, zero = phase.start(state)
    out = phase.run_clients(client_input, zero, data, states)
    part, part_states = out if stateful else (out, None)
    acc = part if acc is None else phase.merge(acc, part)
    new_states.extend(part_states or ())
  return phases[0].finish(state, acc, new_states if stateful else None)
