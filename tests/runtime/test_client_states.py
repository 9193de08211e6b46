"""Client state at compiled speed: every algorithm whose clients keep state runs on
`inprocess` (one chunk, many chunks, or chunks merged as `ray` runs them) and
equals TFF's own runtime of the same process, client states included."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow_federated as tff

from fedsim.runtime import carried_states, inprocess
from tests.learning import builders
from tests.runtime.test_inprocess import ROUNDS

SGD = {"name": "sgd", "learning_rate": 0.4}
EF_TOPK = [{"name": "encode", "encoder": "topk", "fraction": 0.5, "min_elements": 1,
            "error_feedback": True}]
EF_BROADCAST = [{"name": "encode", "encoder": "uniform", "bits": 4, "min_elements": 1,
                 "error_feedback": True}]
# (algorithm, its params, aggregation chain, broadcast chain): each keeps a
# different client state (residual, control variate, local model, optimizer
# slots, a partial accumulation window).
STATEFUL = {
    "fedavg_topk_error_feedback": ("fedavg", {"client_optimizer": SGD}, EF_TOPK, []),
    "fedsgd_topk_error_feedback": ("fedsgd", {}, EF_TOPK, []),
    "scaffold": ("scaffold", {}, [], []),
    "easgd_broadcast_feedback": ("easgd", {}, [], EF_BROADCAST),
    "fedavg_keep_adam": ("fedavg", {"client_optimizer": {"name": "adam", "learning_rate": 0.1},
                                    "client_optimizer_state": "keep"}, [], []),
    "fedavg_carry": ("fedavg", {"client_optimizer": SGD,
                                "gradient_accumulation": {"steps": 2, "remainder": "carry"}},
                     [], []),
}
POPULATION = 3


@functools.cache  # each case built once for the module: no test changes an algorithm
def _algorithm(case):
  name, params, aggregation, broadcast = STATEFUL[case]
  return builders.algorithm(name, params, builders.task_model(num_classes=2),
                            aggregation=aggregation, broadcast=broadcast,
                            num_clients=POPULATION)


def _play(alg, next_fn, state):
  """Four rounds over clients 0..2 (the first two rounds twice), states kept by id."""
  kept = {i: alg.initial_client_state for i in range(POPULATION)}
  measurements = []
  for data in ROUNDS + ROUNDS:
    ids = list(range(len(data)))
    state, m, new_states = next_fn(state, data, [kept[i] for i in ids])
    assert len(new_states) == len(ids)
    kept.update(zip(ids, new_states))
    measurements.append(m)
  return [state, measurements, [kept[i] for i in range(POPULATION)]]


def _leaves(value):
  return [np.asarray(v) for v in tff.structure.flatten(tff.structure.from_container(
      value, recursive=True))]


def _assert_equal(got, want):
  got, want = _leaves(got), _leaves(want)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", sorted(STATEFUL))
def test_stateful_clients_equal_tff_runtime(tff_runtime, case):
  alg = _algorithm(case)
  want = _play(alg, alg.process.next, alg.process.initialize())
  for chunk_bytes in (2**26, 1):  # one graph call a round; one per client
    compiled = inprocess.InProcessProcess(alg.process, "cpu", chunk_bytes=chunk_bytes)
    assert compiled.stateful_clients
    _assert_equal(_play(alg, compiled.next, compiled.initialize()), want)
  # The clients' states really changed (a runtime that dropped them would not).
  assert not all(np.array_equal(g, w) for g, w in zip(
      _leaves(want[2]), _leaves([alg.initial_client_state] * POPULATION)))


@pytest.mark.parametrize("case", ["fedavg_topk_error_feedback", "scaffold"])
def test_chunks_run_apart_and_merged_equal_one_round(case):
  """The phases `ray` runs (clients in chunks, accumulators merged) give the
  same state and the same new client states, in client order."""
  alg = _algorithm(case)
  process = inprocess.InProcessProcess(alg.process, "cpu")
  state = process.initialize()
  data = ROUNDS[0] + ROUNDS[1][:1]
  states = [alg.initial_client_state] * len(data)
  whole = process.next(state, data, states)
  client_input, zero = process.start(state)
  first_acc, first = process.run_clients(client_input, zero, data[:2], states[:2])
  second_acc, second = process.run_clients(client_input, zero, data[2:], states[2:])
  split = process.finish(state, process.merge(first_acc, second_acc), first + second)
  _assert_equal(split, whole)


def _clients_per_call(process):
  """Records the clients of each graph call `process` makes (whole round or chunk)."""
  calls = []
  whole, chunk = process._round, process._clients

  def whole_round(leaves):
    calls.append(leaves[-1].shape[1] - 1)  # its offsets: one column per client, plus one
    return whole(leaves)

  def clients(client_input, acc, data, offsets):
    calls.append(offsets.shape[1] - 1)
    return chunk(client_input, acc, data, offsets)

  process._round, process._clients = whole_round, clients
  return calls


# Five clients of 2, 3, 1, 1 and 4 batches: 80, 120, 40, 40 and 160 bytes of
# data (a batch is 2 x 3 float32 features, 2 int32 labels, 2 float32 mask
# entries); each state is a 3 x 2 kernel and a bias of 2, 32 bytes of float32.
@pytest.mark.parametrize("case", ["fedavg_topk_error_feedback", "scaffold"])
@pytest.mark.parametrize("data_bytes,state_bytes,clients_per_call", [
    (2**26, 2**26, (5,)),          # one call: the whole round
    (2**26, 64, (2, 2, 1)),        # two states a call
    (160, 2**26, (1, 2, 1, 1)),    # 80 | 120 + 40 | 40 | 160
    (160, 32, (1,) * 5),           # either bound alone would pair some
])
def test_a_call_holds_client_data_and_states_up_to_a_bound_each(case, data_bytes, state_bytes,
                                                                clients_per_call):
  """Data and states bound a graph call apart, and however a round splits into
  calls its results are the same bits (the accumulator runs on from call to call)."""
  got = _two_rounds(case, data_bytes, state_bytes, clients_per_call)
  for got_leaf, want in zip(got, _two_rounds(case, 2**26, 2**26, (5,)), strict=True):
    np.testing.assert_array_equal(got_leaf, want)


@functools.cache
def _two_rounds(case: str, data_bytes: int, state_bytes: int, clients_per_call) -> list:
  """The leaves after two rounds of all clients under these bounds, checking the
  clients of each graph call (the one-call reference is shared by the cases)."""
  alg = _algorithm(case)
  data = ROUNDS[0] + ROUNDS[1]
  process = inprocess.InProcessProcess(alg.process, "cpu", chunk_bytes=data_bytes,
                                       state_chunk_bytes=state_bytes)
  calls = _clients_per_call(process)
  state, states = process.initialize(), [alg.initial_client_state] * len(data)
  for _ in range(2):  # the second round reads the states the first returned
    state, measurements, states = process.next(state, data, states)
  assert calls == 2 * list(clients_per_call)
  return _leaves([state, measurements, states])


def _shapes(state):
  """{key: [(shape, dtype) of each tensor]} of a client state (a mapping of sequences)."""
  return {key: [(np.shape(leaf), np.asarray(leaf).dtype.name) for leaf in leaves]
          for key, leaves in state.items()}


def test_the_plan_declares_its_initial_client_state_and_schedule():
  assert _shapes(_algorithm("scaffold").initial_client_state) == {
      "control_variate": [((3, 2), "float32"), ((2,), "float32")]}
  residual = _shapes(_algorithm("fedavg_topk_error_feedback").initial_client_state)
  assert residual == {"residual": [((3, 2), "float32"), ((2,), "float32")]}
  assert _algorithm("scaffold").schedule == "synchronous"
  stateless = builders.algorithm("fedavg", {}, builders.task_model(num_classes=2))
  assert stateless.initial_client_state is None and not stateless.stateful_clients


def test_client_states_must_come_exactly_when_the_clients_keep_state():
  alg = _algorithm("scaffold")
  process = inprocess.InProcessProcess(alg.process, "cpu")
  with pytest.raises(ValueError, match="client states are needed"):
    process.next(process.initialize(), ROUNDS[0])
  with pytest.raises(ValueError, match="3 clients but 2 client states"):
    process.next(process.initialize(), ROUNDS[0], [alg.initial_client_state] * 2)


def test_a_stateful_process_is_viewed_and_compiled_once_for_its_runtimes(monkeypatch):
  """A stateful process is compiled through a view of it (a new process
  object); its MapReduceForm, cached by process object, is compiled once for
  every runtime made for the process, not once per runtime."""
  alg = _algorithm("fedavg_topk_error_feedback")
  view = carried_states.compiled_view(alg.process)
  assert view is not alg.process and carried_states.compiled_view(alg.process) is view
  inprocess.InProcessProcess(alg.process, "cpu")
  compiled = []
  compile_form = tff.backends.mapreduce.get_map_reduce_form_for_computation
  monkeypatch.setattr(tff.backends.mapreduce, "get_map_reduce_form_for_computation",
                      lambda *args: compiled.append(1) or compile_form(*args))
  inprocess.InProcessProcess(alg.process, "cpu", chunk_bytes=1)
  assert compiled == []
  stateless = builders.algorithm("fedavg", {}, builders.task_model(num_classes=2)).process
  assert carried_states.compiled_view(stateless) is stateless
