"""The compiled round's TensorFlow graphs, built from a MapReduceForm's phases.

`start` (prepare, zero), `clients` (a chunk of clients in one `tf.while_loop`,
each worked and accumulated; their new states stacked when they keep state),
`merge` and `finish` (report, update); `whole_round` runs them all in one
graph call for a round whose clients fit one chunk.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import tensorflow as tf

from fedsim.backend import computations

# Clients whose local training may run at once (the client loop's
# parallel_iterations): client c+1 trains while c is accumulated.
OVERLAP = 10


class RoundGraphs(NamedTuple):
  start: Any         # (*state) -> (client_input, zero accumulator)
  clients: Any       # (client_input, acc, data, offsets) -> (acc, stacked new states)
  merge: Any         # (acc, acc) -> acc
  finish: Any        # (state, acc) -> update's flat outputs
  whole_round: Any   # ConcreteFunction: (*state, *data, offsets) -> (outputs, new states)
  state_specs: tuple
  data_specs: tuple  # the concatenated data leaves', then the offsets'


def build_round_graphs(form, state_type, data_leaves: Sequence[Any], kept: Sequence[int],
                       kept_specs: Sequence[tf.TensorSpec], device: str,
                       unsummed: Sequence[int] = ()) -> RoundGraphs:
  """The graphs of `form`'s round on `device`; `kept` are the indices of `work`'s
  outputs that are a client's new state, of `kept_specs` (none when stateless).
  `unsummed`: indices of accumulator leaves the client loop leaves at `zero()`
  (the sum of the kept states, which nothing reads: each client's is stacked).

  Raises:
    computations.NotTensorFlow: a phase is not plain TensorFlow.
  """
  prepare, work, zero, accumulate, merge, report, update = computations.form_phases(form, device)
  acc_specs = computations.tensor_specs(form.zero.type_signature.result)
  state_specs = tuple(computations.tensor_specs(state_type))
  input_specs = tuple(computations.tensor_specs(form.prepare.type_signature.result))
  data_specs = tuple(tf.TensorSpec([None, *t.shape[1:]], tf.as_dtype(t.dtype))
                     for t in data_leaves)
  offset_spec = tf.TensorSpec([len(data_leaves), None], tf.int32)
  skipped = frozenset(unsummed)

  fixed = [all(d is not None for d in t.shape) for t in data_leaves]

  def per_client(j, concatenated, offsets):
    """A leaf of one shape for every client (a client state's) as [clients,
    *shape]: a reshape, checked against the offsets once per call, not per client."""
    if not fixed[j]:
      return concatenated
    shape = data_leaves[j].shape
    rows = shape[0] if shape else 1  # scalars travel as [1] slices
    tf.debugging.assert_equal(offsets[j, 1:] - offsets[j, :-1], rows,
                              message="a client's value has another shape than its type's")
    return tf.reshape(concatenated, [-1, *shape])

  def client_slice(j, leaf, offsets, i):
    if fixed[j]:
      # A row of [clients, *shape] is taken in place when a row is a multiple
      # of 64 bytes (a whole kernel); a range of the concatenation is copied
      # unless each of its own rows is (a 200-wide float kernel's are 800 bytes).
      return leaf[i]
    return tf.ensure_shape(leaf[offsets[j, i]:offsets[j, i + 1]], data_leaves[j].shape)

  def start_graph(state):
    return tuple(prepare(*state)), tuple(zero())

  def clients_graph(client_input, acc, data, offsets):
    """The accumulator after every client, and their new states stacked per leaf."""
    count = tf.shape(offsets)[1] - 1
    kept_arrays = tuple(tf.TensorArray(spec.dtype, size=count, element_shape=spec.shape)
                        for spec in kept_specs)

    leaves = [per_client(j, d, offsets) for j, d in enumerate(data)]

    def body(i, acc, kept_arrays):
      batches = [client_slice(j, leaf, offsets, i) for j, leaf in enumerate(leaves)]
      upload = work(*batches, *client_input)
      kept_arrays = tuple(a.write(i, upload[k]) for a, k in zip(kept_arrays, kept))
      summed = list(accumulate(*acc, *upload))
      for j in skipped:  # the adds then feed nothing, and TensorFlow prunes them
        summed[j] = acc[j]
      for a, spec in zip(summed, acc_specs):
        a.set_shape(spec.shape)  # static only: no op per client and leaf
      return i + 1, tuple(summed), kept_arrays

    _, acc, kept_arrays = tf.while_loop(
        lambda i, *_: i < count, body, (tf.constant(0), tuple(acc), kept_arrays),
        parallel_iterations=OVERLAP)
    return acc, tuple(a.stack() for a in kept_arrays)

  def finish_graph(state, acc):
    return tuple(update(*state, *report(*acc)))

  @computations.graph_function(state_specs)
  def start(*state):
    with tf.device(device):
      return start_graph(state)

  @computations.graph_function((input_specs, tuple(acc_specs), data_specs, offset_spec))
  def clients(client_input, acc, data, offsets):
    with tf.device(device):
      return clients_graph(client_input, acc, data, offsets)  # (acc, new client states)

  @computations.graph_function((tuple(acc_specs), tuple(acc_specs)))
  def merged(first, second):
    with tf.device(device):
      return tuple(merge(*first, *second))

  @computations.graph_function((state_specs, tuple(acc_specs)))
  def finish(state, acc):
    with tf.device(device):
      return finish_graph(state, acc)

  # A round whose clients fit one chunk is one graph call: the phases as
  # separate calls cost ~4 ms a round on small models (W2).
  @computations.graph_function((state_specs, data_specs, offset_spec))
  def whole_round(state, data, offsets):
    with tf.device(device):
      client_input, acc = start_graph(state)
      acc, new_states = clients_graph(client_input, acc, data, offsets)
      return finish_graph(state, acc), new_states

  return RoundGraphs(start, clients, merged, finish, whole_round.get_concrete_function(),
                     state_specs, (*data_specs, offset_spec))
