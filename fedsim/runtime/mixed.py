"""One round whose clients run different compiled rounds, summed into one update.

A controller may give the clients of one round different encoder parameters
(`fedsim.experiment.control`). Each value's algorithm is its own process, but
their MapReduceForms agree on everything the server holds: the state, the
accumulator (what is summed after decoding) and the update. So each group of
clients is worked and accumulated by its own value's round (`start`,
`run_clients`), the groups' accumulators are merged, and the first group's
round finishes (`report` and `update`). This needs a runtime that exposes
those phases (`inprocess`); TFF's own runtime runs a whole round or nothing.
"""

from __future__ import annotations

from typing import Any, Sequence

from fedsim.errors import UserError

# The phases a process must expose to run a mixed round.
_PHASES = ("start", "run_clients", "merge", "finish")


def runs_mixed(process: Any) -> bool:
  """True if `process` exposes the MapReduceForm phases a mixed round needs."""
  return all(hasattr(process, name) for name in _PHASES)


def next_mixed(groups: Sequence[tuple[Any, Sequence[Any], Sequence[Any] | None]], state: Any,
               runtime_name: str = "this runtime") -> tuple[Any, ...]:
  """One round over `groups`, as `process.next` returns it.

  Args:
    groups: (process, its clients' data, their states or None), one per
      value, in the order the values first appear among the round's clients.
    state: the server state (of the same type for every process).

  Returns:
    `(new_state, measurements)`, with client states `(new_state,
    measurements, new_states)`, the new states in `groups`' order, group by group.

  Raises:
    UserError: a group's process does not expose the round's phases.
  """
  if len(groups) == 1:
    process, data, states = groups[0]
    return process.next(state, data) if states is None else process.next(state, data, states)
  for process, _, _ in groups:
    if not runs_mixed(process):
      raise UserError(f"runtime.name: {runtime_name} runs one encoder setting per round, and"
                      " the controller gave this round's clients different values; use"
                      " runtime: inprocess")
  acc, new_states = None, []
  stateful = groups[0][2] is not None
  for process, data, states in groups:
    client_input, zero = process.start(state)
    out = process.run_clients(client_input, zero, data, states)
    part, part_states = out if stateful else (out, None)
    acc = part if acc is None else process.merge(acc, part)
    new_states.extend(part_states or ())
  return groups[0][0].finish(state, acc, new_states if stateful else None)
