"""How the compiled round carries per-client values in and out of the client loop.

A stateful process is `next(state, data, states) -> (state, measurements,
new states)`; a buffered algorithm's dispatch is `next(state, data) ->
(state, measurements, outputs)`, one output per client. Compiled (see
`fedsim.learning.composer.runtime_view` and `outputs_view` here), each
client's state enters with its data, as a `(data, state)` pair, and its new
state or output leaves through `work`'s output under a named field, from which
the client loop stacks the clients' values per leaf.
"""

from __future__ import annotations

import collections
import threading
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


def client_output_type(process) -> tff.Type | None:
  """The type of each client's output when `process.next` returns `(state,
  measurements, outputs@CLIENTS)` (new client states, or a dispatch's results), else None."""
  result = process.next.type_signature.result
  if (not isinstance(result, tff.StructType) or len(result) != 3
      or not isinstance(result[2], tff.FederatedType) or result[2].placement is not tff.CLIENTS):
    return None
  return result[2].member


# The views built last, by the id of the process they view (each entry holds
# that process, so its id is not reused while the entry lives). A view is a new
# process object, and MapReduceForms are cached by process object
# (fedsim.backend.mapreduce): without this, every compiled runtime made for one
# stateful process (a run and its resume in one process, which share the built
# algorithm; the chunk sizes a test compares) compiled the view's
# MapReduceForm again, ~0.5 s on a small model.
_VIEWS: collections.OrderedDict = collections.OrderedDict()
_VIEWS_KEEP = 8
_views_lock = threading.Lock()


def compiled_view(process: tff.templates.IterativeProcess) -> tff.templates.IterativeProcess:
  """What a compiling runtime compiles for `process`: `runtime_view` when its
  clients keep state, `outputs_view` when they return outputs, else `process`;
  the same object for the same process while it is among the newest few."""
  with _views_lock:
    kept = _VIEWS.get(id(process))
    if kept is not None and kept[0] is process:
      _VIEWS.move_to_end(id(process))
      return kept[1]
  if client_state_type(process) is not None:
    from fedsim.learning.composer import runtime_view
    view = runtime_view(process)
  elif client_output_type(process) is not None:
    view = outputs_view(process)
  else:
    return process
  with _views_lock:
    _VIEWS[id(process)] = (process, view)
    while len(_VIEWS) > _VIEWS_KEEP:
      _VIEWS.popitem(last=False)
  return view


def outputs_view(process: tff.templates.IterativeProcess) -> tff.templates.IterativeProcess:
  """`process` (`next(state, data) -> (state, measurements, outputs@CLIENTS)`)
  with the outputs summed under `NEW_CLIENT_STATES`, as `runtime_view` carries
  new client states: `(state, (measurements, summed outputs))`. A runtime that
  runs `work` per client keeps each client's own output and drops the sum."""
  from fedsim.learning.composer import NEW_CLIENT_STATES
  output_type = client_output_type(process)

  @tff.tensorflow.computation(output_type)
  def marked(output):
    return collections.OrderedDict([(NEW_CLIENT_STATES, output)])

  state_type, data_type = process.next.type_signature.parameter

  @tff.federated_computation(state_type, data_type)
  def next_fn(state, data):
    new_state, measurements, outputs = process.next(state, data)
    return new_state, (measurements, tff.federated_sum(tff.federated_map(marked, outputs)))

  return tff.templates.IterativeProcess(process.initialize, next_fn)


def check_states(client_states: Sequence[Any] | None, count: int, stateful: bool) -> None:
  """Raises ValueError unless there are client states exactly when the clients
  keep state, one per client."""
  if (client_states is None) == stateful:
    raise ValueError("client states are needed exactly when the clients keep state"
                     f" (this round's clients keep state: {stateful})")
  if client_states is not None and len(client_states) != count:
    raise ValueError(f"{count} clients but {len(client_states)} client states")


def new_state_leaves(form, state_type) -> list[int]:
  """Indices of `work`'s flat outputs that are the client's new state or output
  ([] without one).

  `runtime_view` and `outputs_view` sum them under `NEW_CLIENT_STATES`; TFF
  keeps that field's name in the aggregated struct, `work`'s first result.

  Raises:
    NotCarried: no such field.
  """
  if state_type is None:
    return []
  found = _marked_leaves(form.work.type_signature.result[0])
  if found is None:
    raise NotCarried("the compiled round does not return the clients' new states")
  return found


def summed_state_leaves(form, state_type) -> list[int]:
  """Indices of the accumulator's flat leaves that hold the sum of the clients'
  new states or outputs ([] without one, or when the accumulator does not keep
  that field apart). The sum only carries each client's own value out of `work`
  and is dropped, so a client loop may skip accumulating it: a pass over the
  state per client."""
  if state_type is None:
    return []
  return _marked_leaves(form.zero.type_signature.result) or []


def _marked_leaves(struct_type) -> list[int] | None:
  """The flat leaf indices of `struct_type`'s element that is a struct holding only
  `NEW_CLIENT_STATES`, or None."""
  from fedsim.learning.composer import NEW_CLIENT_STATES
  start = 0
  for _, element in tff.structure.iter_elements(struct_type):
    count = len(computations.tensor_leaves(element))
    if isinstance(element, tff.StructType):
      names = [n for n, _ in tff.structure.iter_elements(element)]
      if names == [NEW_CLIENT_STATES]:
        return list(range(start, start + count))
    start += count
  return None


def paired(client_data: Sequence[Any], client_states: Sequence[Any] | None, stateful: bool):
  """The clients as the compiled round reads them: `(data, state)` pairs when stateful.

  Raises:
    ValueError: states given for stateless clients or missing for stateful
      ones, or not one per client.
  """
  check_states(client_states, len(client_data), stateful)
  if client_states is None:
    return client_data
  return zip(client_data, client_states)


def unstack(parts, state_type) -> list[Any]:
  """Per client, its new state (or output) in `state_type`'s containers, from each
  chunk's leaves stacked on a leading client axis ([] when `state_type` is None)."""
  if state_type is None:
    return []
  out = []
  for stacked in parts:
    arrays = [np.asarray(t) for t in stacked]
    for i in range(len(arrays[0]) if arrays else 0):
      out.append(computations.pack([a[i] for a in arrays], state_type))
  return out
