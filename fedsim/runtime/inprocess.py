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
import os
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.errors import UserError
from fedsim.backend import computations
from fedsim.backend.mapreduce import map_reduce_form

DEVICES = ("auto", "cpu", "gpu")
# Client data concatenated for one graph call: bounds the copy a round makes
# (1,000 EMNIST clients would otherwise be ~300 MiB at once).
_CHUNK_BYTES = 64 * 2**20
# Clients whose local training may run at once (the client loop's
# parallel_iterations): client c+1 trains while c is accumulated.
_OVERLAP = 10


def configure_threads(threads: str) -> bool:
  """Sets TensorFlow's CPU thread pools for `runtime.threads`, if TF has not started.

  'clients': each op on one thread, as many ops at once as there are cores:
  a batch's small ops do not scale across cores, but clients train side by
  side (W2 1.3-1.6x, W1 ~1.4x faster rounds on 2 cores, see bench/).
  'tensorflow' keeps TF's defaults.

  Returns:
    True when the pools were set; False when left alone, or when TensorFlow
    already runs in this process (its pools are fixed then, e.g. in tests).
  """
  if threads != "clients":
    return False
  try:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(os.cpu_count() or 1)
  except RuntimeError:  # TF's context exists: its pools are made
    return False
  return True


class NotCompilable(Exception):
  """The process cannot run in-process; the `local` runtime can run it.

  The message is one line saying why (e.g. stateful clients, tf.data client
  data, several aggregation phases, secure aggregation).
  """


def select_device(requested: str, gpus: Sequence[Any] | None = None) -> str:
  """The TensorFlow device name for `runtime.device`.

  Args:
    requested: 'auto' (a GPU when one is visible, else the CPU), 'cpu' or 'gpu'.
    gpus: the visible GPUs; None asks TensorFlow.

  Returns:
    '/GPU:0' or '/CPU:0'.

  Raises:
    UserError: an unknown name, or 'gpu' when TensorFlow sees no GPU.
  """
  if requested not in DEVICES:
    raise UserError(f"runtime.device: unknown device '{requested}'; choose one of:"
                    f" {', '.join(DEVICES)}")
  if requested == "cpu":
    return "/CPU:0"
  if gpus is None:
    gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    return "/GPU:0"
  if requested == "gpu":
    raise UserError("runtime.device: 'gpu' but TensorFlow sees no GPU (install the"
                    " 'gpu' extra on a CUDA machine, or use 'auto' or 'cpu')")
  return "/CPU:0"


class InProcessProcess:
  """An `IterativeProcess` run in this process, with the same interface.

  `initialize()` and `next(state, client_data)` take and return the same
  Python structures as `process` does on TFF's runtime (`client_data` is the
  list of per-client values), so the run loop and `FederatedAlgorithm` work
  on either.
  """

  def __init__(self, process: tff.templates.IterativeProcess, device: str = "auto",
               chunk_bytes: int = _CHUNK_BYTES):
    """Compiles `process`; takes 1-2 s.

    Raises:
      NotCompilable: `process` has no MapReduceForm (stateful clients,
        several aggregation phases), non-tensor client data (tf.data), secure
        aggregation or TensorFlow variables.
      UserError: see `select_device`.
    """
    self.device = select_device(device)
    self._chunk_bytes = chunk_bytes
    self._client_state_type = _client_state_type(process)
    if self._client_state_type is not None:
      # Client states enter with the client data and leave through `work`
      # (see composer.runtime_view); the round keeps each client's own.
      from fedsim.learning.composer import runtime_view
      process = runtime_view(process)
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

  def _build(self, form, process) -> None:
    if form.securely_aggregates_tensors:
      raise NotCompilable("the process uses secure aggregation")
    if not form.prepare.type_signature.parameter.is_equivalent_to(self._state_type):
      raise NotCompilable("its MapReduceForm prepares from part of the server state")
    init = tff.backends.mapreduce.get_state_initialization_computation(process.initialize)
    self._init = computations.concrete_function(init, "initialize")
    prepare = computations.concrete_function(form.prepare, "prepare")
    work = computations.concrete_function(form.work, "work")
    zero = computations.concrete_function(form.zero, "zero")
    accumulate = computations.concrete_function(form.accumulate, "accumulate")
    merge = computations.concrete_function(form.merge, "merge")
    report = computations.concrete_function(form.report, "report")
    update = computations.concrete_function(form.update, "update")
    acc_specs = computations.tensor_specs(form.zero.type_signature.result)
    device = self.device
    data_leaves = self._data_leaves
    state_specs = tuple(computations.tensor_specs(self._state_type))
    input_specs = tuple(computations.tensor_specs(form.prepare.type_signature.result))
    data_specs = tuple(tf.TensorSpec([None, *t.shape[1:]], tf.as_dtype(t.dtype))
                       for t in data_leaves)
    offset_spec = tf.TensorSpec([len(data_leaves), None], tf.int32)
    kept = _new_state_leaves(form, self._client_state_type)
    kept_specs = [tf.TensorSpec(t.shape, tf.as_dtype(t.dtype))
                  for t in computations.tensor_leaves(self._client_state_type)]

    def client_slice(leaf_type, concatenated, start, end):
      part = concatenated[start:end]
      if not leaf_type.shape:  # scalars travel as [1] slices
        return tf.reshape(part, [])
      return tf.ensure_shape(part, leaf_type.shape)

    def start_graph(state):
      return tuple(prepare(*state)), tuple(zero())

    def clients_graph(client_input, acc, data, offsets):
      """The accumulator after every client, and their new states stacked per leaf."""
      count = tf.shape(offsets)[1] - 1
      kept_arrays = tuple(tf.TensorArray(spec.dtype, size=count, element_shape=spec.shape)
                          for spec in kept_specs)

      def body(i, acc, kept_arrays):
        batches = [client_slice(t, d, offsets[j, i], offsets[j, i + 1])
                   for j, (t, d) in enumerate(zip(data_leaves, data))]
        upload = work(*batches, *client_input)
        kept_arrays = tuple(a.write(i, upload[k]) for a, k in zip(kept_arrays, kept))
        summed = accumulate(*acc, *upload)
        for a, spec in zip(summed, acc_specs):
          a.set_shape(spec.shape)  # static only: no op per client and leaf
        return i + 1, tuple(summed), kept_arrays

      _, acc, kept_arrays = tf.while_loop(
          lambda i, *_: i < count, body, (tf.constant(0), tuple(acc), kept_arrays),
          parallel_iterations=_OVERLAP)
      return acc, tuple(a.stack() for a in kept_arrays)

    def finish_graph(state, acc):
      return tuple(update(*state, *report(*acc)))

    @tf.function(input_signature=state_specs)
    def start(*state):
      with tf.device(device):
        return start_graph(state)

    @tf.function(input_signature=(input_specs, tuple(acc_specs), data_specs, offset_spec))
    def clients(client_input, acc, data, offsets):
      with tf.device(device):
        return clients_graph(client_input, acc, data, offsets)  # (acc, new client states)

    @tf.function(input_signature=(tuple(acc_specs), tuple(acc_specs)))
    def merged(first, second):
      with tf.device(device):
        return tuple(merge(*first, *second))

    @tf.function(input_signature=(state_specs, tuple(acc_specs)))
    def finish(state, acc):
      with tf.device(device):
        return finish_graph(state, acc)

    # A round whose clients fit one chunk is one graph call: the phases as
    # separate calls cost ~4 ms a round on small models (W2).
    @tf.function(input_signature=(state_specs, data_specs, offset_spec))
    def whole_round(state, data, offsets):
      with tf.device(device):
        client_input, acc = start_graph(state)
        acc, new_states = clients_graph(client_input, acc, data, offsets)
        return finish_graph(state, acc), new_states

    self._start, self._clients, self._merge, self._finish = start, clients, merged, finish
    # Its one trace, called on flat tensors: skips tf.function's dispatch
    # (~0.5 ms of a W2 round) and the concrete function's argument binding (~0.3 ms).
    self._round = computations.direct_call(whole_round.get_concrete_function())
    self._state_specs = state_specs
    self._state_shapes = [tuple(spec.shape) for spec in state_specs]
    self._data_specs = (*data_specs, offset_spec)
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
    chunks = self._chunks(self._paired(client_data, client_states))
    ahead = list(itertools.islice(chunks, 2))
    if len(ahead) == 1:
      data, offsets = self._concatenate(ahead[0])
      leaves = self._round([*self._state_leaves(state),
                            *computations.eager_tensors([*data, offsets], self._data_specs)])
      return self._result(leaves[:self._round_leaves],
                          self._unstack([leaves[self._round_leaves:]]))
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
    with client states, `(acc, new_client_states)`."""
    acc, new_states = self._run_chunks(
        client_input, acc, self._chunks(self._paired(client_data, client_states)))
    return acc if new_states is None else (acc, new_states)

  def merge(self, first, second) -> tuple[tf.Tensor, ...]:
    """The MapReduceForm's `merge` of two partial accumulators."""
    return self._merge(tuple(first), tuple(second))

  def finish(self, state: Any, acc, new_client_states: Sequence[Any] | None = None
             ) -> tuple[Any, ...]:
    """`update(state, report(acc))`: `(new_state, measurements)`, and
    `new_client_states` third when the clients keep state."""
    leaves = self._finish(tuple(self._state_leaves(state)), tuple(acc))
    return self._result(leaves, new_client_states)

  def _run_chunks(self, client_input, acc, chunks) -> tuple[Any, list | None]:
    parts = []
    for chunk in chunks:
      acc, stacked = self._clients(tuple(client_input), tuple(acc), *self._concatenate(chunk))
      parts.append(stacked)
    return acc, (self._unstack(parts) if self.stateful_clients else None)

  def _result(self, round_leaves, new_client_states) -> tuple[Any, ...]:
    packed = computations.pack(round_leaves, self._result_type)
    if not self.stateful_clients:
      return packed
    # The summed states only carried each client's own out of `work`: dropped.
    new_state, (measurements, _) = packed
    return new_state, measurements, list(new_client_states)

  def _unstack(self, parts) -> list[Any]:
    """Per client, its new state in the client-state type's containers ([] when stateless)."""
    if not self.stateful_clients:
      return []
    out = []
    for stacked in parts:
      arrays = [np.asarray(t) for t in stacked]
      for i in range(len(arrays[0]) if arrays else 0):
        out.append(computations.pack([a[i] for a in arrays], self._client_state_type))
    return out

  def _paired(self, client_data: Sequence[Any], client_states: Sequence[Any] | None):
    """The clients as the compiled round reads them: `(data, state)` pairs when stateful."""
    if (client_states is None) != (not self.stateful_clients):
      raise ValueError("client states are needed exactly when the clients keep state"
                       f" (this round's clients keep state: {self.stateful_clients})")
    if client_states is None:
      return client_data
    if len(client_states) != len(client_data):
      raise ValueError(f"{len(client_data)} clients but {len(client_states)} client states")
    return zip(client_data, client_states)

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

  def _chunks(self, client_data: Sequence[Any]):
    """Lists of clients, each a list of its data leaves as arrays of the leaf types.

    Scalar leaves become shape [1], so that every leaf concatenates on axis 0.
    """
    flatten = computations.flattener(self._data_type)
    shapes = [(np.dtype(t.dtype), (-1, *t.shape[1:]) if t.shape else (1,))
              for t in self._data_leaves]
    chunk, size = [], 0
    for client in client_data:
      leaves = []
      flatten(client, leaves.append)
      leaves = [np.asarray(v, dtype).reshape(shape) for v, (dtype, shape) in zip(leaves, shapes)]
      nbytes = sum(v.nbytes for v in leaves)
      if chunk and size + nbytes > self._chunk_bytes:
        yield chunk
        chunk, size = [], 0
      chunk.append(leaves)
      size += nbytes
    if chunk:
      yield chunk

  @staticmethod
  def _concatenate(chunk: list[list[np.ndarray]]):
    """Per data leaf, the clients' values end to end, and where each starts."""
    leaves = list(zip(*chunk))
    offsets = np.zeros((len(leaves), len(chunk) + 1), np.int32)
    for j, parts in enumerate(leaves):
      np.cumsum([len(p) for p in parts], out=offsets[j, 1:])
    return tuple(np.concatenate(parts) for parts in leaves), offsets


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


def _client_state_type(process) -> tff.Type | None:
  """The client-state type when `process.next` is `(state, data, states) ->
  (state, measurements, states)` (see fedsim.learning.composer), else None."""
  params = process.next.type_signature.parameter
  if len(params) != 3 or not isinstance(params[2], tff.FederatedType):
    return None
  return params[2].member


def _new_state_leaves(form, client_state_type) -> list[int]:
  """Indices of `work`'s flat outputs that are the client's new state ([] without one).

  `runtime_view` sums the new states under `NEW_CLIENT_STATES`; TFF keeps
  that field's name in the aggregated struct, `work`'s first result.
  """
  if client_state_type is None:
    return []
  from fedsim.learning.composer import NEW_CLIENT_STATES
  aggregated = form.work.type_signature.result[0]
  start = 0
  for name, element in tff.structure.iter_elements(aggregated):
    count = len(computations.tensor_leaves(element))
    if isinstance(element, tff.StructType):
      names = [n for n, _ in tff.structure.iter_elements(element)]
      if names == [NEW_CLIENT_STATES]:
        return list(range(start, start + count))
    start += count
  raise NotCompilable("the compiled round does not return the clients' new states")


def _map_reduce_form(process):
  try:
    return map_reduce_form(process)  # cached: sizing compiled the same process
  except ValueError as e:
    raise NotCompilable(f"no MapReduceForm for this process: {e}") from e
