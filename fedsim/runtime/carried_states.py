"""How the compiled round carries the states of clients that keep state.

A stateful process is `next(state, data, states) -> (state, measurements,
new states)`. Compiled (see `fedsim.learning.composer.runtime_view`), each
client's state enters with its data, as a `(data, state)` pair, and its new
state leaves through `work`'s output under a named field, from which the
client loop stacks the clients' new states per leaf.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow_federated as tff

from fedsim.backend import computations


class NotCarried(Exception):
  """The compiled round does not return the clients' new states (one line)."""


def client_state_type(process) -> tff.Type | None:
  """The client-state type when `process.next` is `(state, data, states) ->
  (state, measurements, states)` (see fedsim.learning.composer), else None."""
  params = process.next.type_signature.parameter
  if len(params) != 3 or not isinstance(params[2], tff.FederatedType):
    return None
  return params[2].member


def new_state_leaves(form, state_type) -> list[int]:
  """Indices of `work`'s flat outputs that are the client's new state ([] without one).

  `runtime_view` sums the new states under `NEW_CLIENT_STATES`; TFF keeps
  that field's name in the aggregated struct, `work`'s first result.

  Raises:
    NotCarried: no such field.
  """
  if state_type is None:
    return []
  from fedsim.learning.composer import NEW_CLIENT_STATES
  aggregated = form.work.type_signature.result[0]
  start = 0
  for _, element in tff.structure.iter_elements(aggregated):
    count = len(computations.tensor_leaves(element))
    if isinstance(element, tff.StructType):
      names = [n for n, _ in tff.structure.iter_elements(element)]
      if names == [NEW_CLIENT_STATES]:
        return list(range(start, start + count))
    start += count
  raise NotCarried("the compiled round does not return the clients' new states")


def paired(client_data: Sequence[Any], client_states: Sequence[Any] | None, stateful: bool):
  """The clients as the compiled round reads them: `(data, state)` pairs when stateful.

  Raises:
    ValueError: states given for stateless clients or missing for stateful
      ones, or not one per client.
  """
  if (client_states is None) == stateful:
    raise ValueError("client states are needed exactly when the clients keep state"
                     f" (this round's clients keep state: {stateful})")
  if client_states is None:
    return client_data
  if len(client_states) != len(client_data):
    raise ValueError(f"{len(client_data)} clients but {len(client_states)} client states")
  return zip(client_data, client_states)


def unstack(parts, state_type) -> list[Any]:
  """Per client, its new state in the client-state type's containers, from each
  chunk's leaves stacked on a leading client axis ([] when `state_type` is None)."""
  if state_type is None:
    return []
  out = []
  for stacked in parts:
    arrays = [np.asarray(t) for t in stacked]
    for i in range(len(arrays[0]) if arrays else 0):
      out.append(computations.pack([a[i] for a in arrays], state_type))
  return out
