"""The `inprocess` runtime: a compiled round run in this process's TensorFlow.

TFF's runtime runs every computation in its C++ worker, which has no CUDA and
pays a fixed cost per client call. Here the round is first compiled to TFF's
MapReduceForm -- the same form sizing reads, so what is sized is what runs:

    client_input = prepare(state)                      (server -> each client)
    acc = zero(); for each client c:
      acc = accumulate(acc, work(data_c, client_input))  (clients -> server)
    state', measurements = update(state, report(acc))

Each of those is a plain TensorFlow graph (see `fedsim.backend.computations`). The loop over
clients runs inside one `tf.function` call per chunk of clients, so per-client
cost is a loop iteration, not a runtime call; TensorFlow overlaps the
iterations' independent work (client c+1 trains while c is accumulated).
Clients keep their own step counts: their batches are concatenated and each
iteration slices its client back out, so `work` sees exactly the input the
`local` runtime gives it and results agree to float rounding.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.backend import computations
from fedsim.backend.mapreduce import map_reduce_form, state_initialization
from fedsim.runtime import carried_states
from fedsim.runtime.chunks import ChunkBounds, chunks as client_chunks, concatenate
from fedsim.runtime.contract import RoundPhases, RoundProcess
from fedsim.runtime.devices import select_device
from fedsim.runtime.round_graphs import build_round_graphs

# Client data concatenated for one graph call: bounds the copy a round makes
# (1,000 EMNIST clients would otherwise be ~300 MiB at once).
_CHUNK_BYTES = 64 * 2**20
# Client states one graph call holds, bounded apart from their data: the states
# are in memory already (the client-state store), and a call adds only their
# concatenation (none when they are the rows the last call stacked, in order)
# and its stacked new states, which the store then keeps. Under the data's
# bound P1's 50 SCAFFOLD clients (6.5 MB of state each) took six calls, each
# ending with one client training alone; under this one they take one.
_STATE_CHUNK_BYTES = 512 * 2**20


class NotCompilable(Exception):
  """The process cannot run in-process; the `local` runtime can run it.

  The message is one line saying why (e.g. tf.data client data, several
  aggregation phases, secure aggregation).
  """


class InProcessProcess(RoundProcess, RoundPhases):
  """An `IterativeProcess` run in this process: a `RoundProcess` that is its own phases.

  `initialize()` and `next(state, client_data)` (or `next(state, client_data,
  client_states)` when the clients keep state) take and return the same
  Python structures as `process` does on TFF's runtime (`client_data` is the
  sequence of per-client values). A process that returns per-client outputs
  (`next(state, data) -> (state, measurements, outputs@CLIENTS)`, a buffered
  algorithm's dispatch) returns them third, one per client.
  """

  def __init__(self, process: tff.templates.IterativeProcess, device: str = "auto",
               chunk_bytes: int = _CHUNK_BYTES, state_chunk_bytes: int = _STATE_CHUNK_BYTES):
    """Compiles `process`; takes 1-2 s. A graph call runs as many clients as
    fit `chunk_bytes` of client data and `state_chunk_bytes` of client states
    (at least one).

    Raises:
      NotCompilable: `process` has no MapReduceForm (e.g. several aggregation
        phases), non-tensor client data (tf.data), secure aggregation or
        TensorFlow variables.
      UserError: see `select_device`.
    """
    self.device = select_device(device)
    self._client_state_type = carried_states.client_state_type(process)
    self._chunk_bounds = ChunkBounds(chunk_bytes, state_chunk_bytes)
    self._output_type = carried_states.client_output_type(process)
    # Client states enter with the client data and leave through `work`
    # (see composer.runtime_view); the round keeps each client's own.
    process = carried_states.compiled_view(process)
    next_type = process.next.type_signature
    params = next_type.parameter
    if len(params) != 2 or not all(isinstance(p, tff.FederatedType) for p in params):
      raise NotCompilable(f"next must take (state@SERVER, data@CLIENTS), not {params}")
    if params[0].placement is not tff.SERVER or params[1].placement is not tff.CLIENTS:
      raise NotCompilable("next must take (state@SERVER, data@CLIENTS) or, with client"
                          f" states, (state@SERVER, data@CLIENTS, states@CLIENTS) (got {params})")
    self._state_type, self._data_type = params[0].member, params[1].member
    self._result_type = next_type.result
    self._init_type = process.initialize.type_signature.result
    try:
      self._data_leaves = computations.tensor_leaves(self._data_type)
      # The (data, state) pairs' last leaves (see `runtime_view`).
      self._client_state_leaves = len(computations.tensor_leaves(self._client_state_type))
    except computations.NotTensorFlow as e:
      raise NotCompilable(f"client data must be tensors (e.g. packed batches): {e}") from None
    form = _map_reduce_form(process)
    try:
      self._build(form, process)
    except computations.NotTensorFlow as e:
      raise NotCompilable(str(e)) from None

  @property
  def stateful_clients(self) -> bool:
    """Whether `next` takes and returns client states (see `next`)."""
    return self._client_state_type is not None

  @property
  def client_outputs(self) -> bool:
    """Whether `next` returns one value per client third (new states or outputs)."""
    return self._output_type is not None

  @property
  def phases(self) -> RoundPhases:
    return self

  def _build(self, form, process) -> None:
    if form.securely_aggregates_tensors:
      raise NotCompilable("the process uses secure aggregation")
    if not form.prepare.type_signature.parameter.is_equivalent_to(self._state_type):
      raise NotCompilable("its MapReduceForm prepares from part of the server state")
    init = state_initialization(process.initialize)
    self._init = computations.concrete_function(init, "initialize")
    try:
      kept = carried_states.new_state_leaves(form, self._output_type)
      unsummed = carried_states.summed_state_leaves(form, self._output_type)
    except carried_states.NotCarried as e:
      raise NotCompilable(str(e)) from None
    kept_specs = [tf.TensorSpec(t.shape, tf.as_dtype(t.dtype))
                  for t in computations.tensor_leaves(self._output_type)]
    graphs = build_round_graphs(form, self._state_type, self._data_leaves, kept, kept_specs,
                                self.device, unsummed)
    self._start, self._clients = graphs.start, graphs.clients
    self._merge, self._finish = graphs.merge, graphs.finish
    # Its one trace, called on flat tensors: skips tf.function's dispatch
    # (~0.5 ms of a W2 round) and the concrete function's argument binding (~0.3 ms).
    self._round = computations.direct_call(graphs.whole_round)
    self._state_specs = graphs.state_specs
    self._state_shapes = [tuple(spec.shape) for spec in graphs.state_specs]
    self._data_specs = graphs.data_specs
    self._round_leaves = len(computations.tensor_leaves(self._result_type))

  def initialize(self) -> Any:
    """The initial server state, as `process.initialize()` returns it."""
    with tf.device(self.device):
      leaves = self._init()
    return computations.pack(leaves, self._init_type)

  def next(self, state: Any, client_data: Sequence[Any],
           client_states: Sequence[Any] | None = None) -> tuple[Any, ...]:
    """One round, as `process.next`: `(new_state, measurements)`, or with client
    states `(new_state, measurements, new_client_states)` (one per client, in order)."""
    # Two chunks ahead at most: `client_data` may pack its clients as they are
    # read (RoundClients), so each is read once and 10,000 are never held at once.
    chunks = self._chunks(client_data, client_states)
    ahead = list(itertools.islice(chunks, 2))
    if len(ahead) == 1:
      data, offsets = concatenate(ahead[0])
      leaves = self._round([*self._state_leaves(state),
                            *computations.eager_tensors([*data, offsets], self._data_specs)])
      return self._result(leaves[:self._round_leaves],
                          carried_states.unstack([leaves[self._round_leaves:]],
                                                 self._output_type))
    client_input, acc = self.start(state)
    acc, new_states = self._run_chunks(client_input, acc, itertools.chain(ahead, chunks))
    return self.finish(state, acc, new_states)

  # The round in the MapReduceForm's phases, for runtimes that spread the
  # clients over several processes (e.g. `fedsim.runtime.ray`): `start` on
  # the driver, `run_clients` on each chunk of clients (anywhere, each from
  # `zero()`), `merge` of the chunks' accumulators, then `finish`.

  def start(self, state: Any) -> tuple[tuple[tf.Tensor, ...], tuple[tf.Tensor, ...]]:
    """`(client_input, zero accumulator)` of the round: `prepare(state)`, `zero()`."""
    return self._start(*self._state_leaves(state))

  def run_clients(self, client_input, acc, client_data: Sequence[Any],
                  client_states: Sequence[Any] | None = None) -> Any:
    """`acc` with every client of `client_data` worked and accumulated, in order;
    with per-client outputs (`client_outputs`), `(acc, outputs)`."""
    acc, new_states = self._run_chunks(client_input, acc,
                                       self._chunks(client_data, client_states))
    return acc if new_states is None else (acc, new_states)

  def merge(self, first, second) -> tuple[tf.Tensor, ...]:
    """The MapReduceForm's `merge` of two partial accumulators."""
    return self._merge(tuple(first), tuple(second))

  def finish(self, state: Any, acc, outputs: Sequence[Any] | None = None) -> tuple[Any, ...]:
    """`update(state, report(acc))`: `(new_state, measurements)`, and the
    clients' `outputs` third when the round has them."""
    leaves = self._finish(tuple(self._state_leaves(state)), tuple(acc))
    return self._result(leaves, outputs)

  def _run_chunks(self, client_input, acc, chunks) -> tuple[Any, list | None]:
    parts = []
    for chunk in chunks:
      acc, stacked = self._clients(tuple(client_input), tuple(acc), *concatenate(chunk))
      parts.append(stacked)
    if not self.client_outputs:
      return acc, None
    return acc, carried_states.unstack(parts, self._output_type)

  def _chunks(self, client_data: Sequence[Any], client_states: Sequence[Any] | None):
    clients = carried_states.paired(client_data, client_states, self.stateful_clients)
    return client_chunks(clients, self._data_type, self._data_leaves, self._chunk_bounds,
                         self._client_state_leaves)

  def _result(self, round_leaves, new_client_states) -> tuple[Any, ...]:
    packed = computations.pack(round_leaves, self._result_type)
    if not self.client_outputs:
      return packed
    # The summed values only carried each client's own out of `work`: dropped.
    new_state, (measurements, _) = packed
    return new_state, measurements, list(new_client_states)

  def _state_leaves(self, state: Any) -> list[tf.Tensor]:
    """The state's leaves as tensors of the state type's dtypes.

    Raises:
      ValueError: a leaf's shape is not the state type's (the graph would not say).
    """
    leaves = computations.flatten(state, self._state_type)
    for leaf, spec, shape in zip(leaves, self._state_specs, self._state_shapes):
      if np.shape(leaf) != shape and not spec.shape.is_compatible_with(np.shape(leaf)):
        raise ValueError(f"a state leaf has shape {np.shape(leaf)}, the state type says"
                         f" {spec.shape}")
    return computations.eager_tensors(leaves, self._state_specs)

def tensorflow_function(computation: tff.Computation, device: str = "auto"):
  """A TFF TensorFlow computation as a Python function run in this process.

  Called like the computation itself (one argument, or one per element of a
  struct parameter) and returns what TFF's runtime would, e.g. for the
  evaluator of the run loop.

  Raises:
    NotCompilable: `computation` is not plain TensorFlow over tensors.
    UserError: see `select_device`.
  """
  device = select_device(device)
  try:
    function = computations.concrete_function(computation, "computation")
  except computations.NotTensorFlow as e:
    raise NotCompilable(str(e)) from None
  signature = computation.type_signature

  def call(*args):
    if len(args) == 1:
      leaves = computations.flatten(args[0], signature.parameter)
    else:
      leaves = [leaf for arg, arg_type in zip(args, signature.parameter.children())
                for leaf in computations.flatten(arg, arg_type)]
    with tf.device(device):
      result = function(*leaves)
    return computations.pack(result, signature.result)

  return call


def _map_reduce_form(process):
  try:
    return map_reduce_form(process)  # cached: sizing compiled the same process
  except ValueError as e:
    raise NotCompilable(f"no MapReduceForm for this process: {e}") from e
