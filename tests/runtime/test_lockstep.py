"""The `lockstep` runtime gives what `inprocess` gives, and names what it cannot run."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow_federated as tff

from fedsim.compression import parse_compression
from fedsim.errors import UserError
from fedsim.runtime import inprocess, lockstep
from fedsim.runtime.runtime_registry import RuntimeContext, runtime_of
from tests.learning import builders

BATCH, DIM, CLASSES = 4, 6, 3


def _clients(seed, examples):
  """Clients with `examples[i]` examples in batches of BATCH (the last one partial)."""
  rng = np.random.default_rng(seed)
  out = []
  for n in examples:
    steps = -(-n // BATCH)
    mask = (np.arange(steps * BATCH) < n).astype(np.float32).reshape(steps, BATCH)
    out.append({"x": rng.normal(size=(steps, BATCH, DIM)).astype(np.float32),
                "y": rng.integers(0, CLASSES, (steps, BATCH)).astype(np.int32),
                "mask": mask})
  return out


# Unequal clients: 1 batch against 4, partial last batches (5 = 4 + 1, 10 = 4 + 4 + 2).
ROUNDS = [_clients(1, [5, 13, 3]), _clients(2, [4, 16]), _clients(3, [10, 2, 7, 1])]

MODELS = {"mlp": {"hidden": [5]}, "logistic": {}}
ALGORITHMS = {
    # Momentum and Adam keep optimizer state that an all-padding step must not touch.
    "fedavg": {"client_optimizer": {"name": "sgd", "learning_rate": 0.3, "momentum": 0.9},
               "server_optimizer": {"name": "sgd", "learning_rate": 0.8}},
    "fedprox": {"client_optimizer": {"name": "adam", "learning_rate": 0.05}, "mu": 0.1,
                "client_weighting": "uniform"},
    "fedsgd": {"server_optimizer": {"name": "sgd", "learning_rate": 0.5, "momentum": 0.5}},
}
# Deterministic rounding: what each client sends is a function of its update
# alone, so both runtimes encode the same bits. min_elements 16 encodes each
# model's first kernel (mlp 6x5, logistic 6x3) and sends the rest as is: both
# kinds of upload, with one encoder to compile instead of one per tensor.
ENCODER = {"aggregation": {"encoder": "uniform", "bits": 8, "min_elements": 16,
                           "rounding": "deterministic"}}


def _leaves(value):
  return [np.asarray(v) for v in tff.structure.flatten(tff.structure.from_container(
      value, recursive=True))]


def _run(process):
  state = process.initialize()
  measurements = []
  for data in ROUNDS:
    state, m = process.next(state, data)
    measurements.append(m)
  return state, measurements


@functools.cache
def _algorithm(model_name, algorithm_name, encoded):
  """Built once per module: tests that share one share its build and compiled
  MapReduceForm (runtimes read the algorithm, never change it)."""
  model = builders.task_model(model_name, input_shape=(DIM,), num_classes=CLASSES,
                              **MODELS[model_name])
  compression = parse_compression(ENCODER) if encoded else None
  return builders.algorithm(algorithm_name, ALGORITHMS[algorithm_name], model,
                            batch_size=BATCH, compression=compression)


@pytest.fixture(scope="module", autouse=True)
def _free_algorithms():
  yield
  _algorithm.cache_clear()


CASES = [(m, a, e) for m in MODELS for a in ALGORITHMS for e in (False, True)]
DEFAULT = {("mlp", "fedavg", False), ("logistic", "fedsgd", False), ("mlp", "fedprox", True)}


@pytest.mark.parametrize("model_name,algorithm_name,encoded", [
    pytest.param(*case, marks=() if case in DEFAULT else pytest.mark.long) for case in CASES])
def test_three_rounds_equal_inprocess(tff_runtime, model_name, algorithm_name, encoded):
  algorithm = _algorithm(model_name, algorithm_name, encoded)
  want_state, want_metrics = _run(inprocess.InProcessProcess(algorithm.process, "cpu"))
  got_state, got_metrics = _run(lockstep.LockstepRound(algorithm, "cpu"))

  assert type(got_state) is type(want_state)
  assert got_metrics[0].keys() == want_metrics[0].keys()
  for got, want in [(got_state, want_state), (got_metrics, want_metrics)]:
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
      assert g.dtype == w.dtype and g.shape == w.shape
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  assert float(got_metrics[2]["client_work"]["num_examples"]) == 10 + 2 + 7 + 1
  initial = algorithm.process.initialize().global_model_weights.trainable[0]
  assert not np.allclose(got_state.global_model_weights.trainable[0], initial)


def test_chunks_of_clients_give_the_same_round(tff_runtime):
  """Clients over several graph calls (a round too big for one) add up the same."""
  algorithm = _algorithm("logistic", "fedavg", False)
  whole = lockstep.LockstepRound(algorithm, "cpu")
  assert len(list(lockstep.padded_chunks(ROUNDS[2], lockstep._CHUNK_BYTES, 0))) == 1
  chunked = lockstep.LockstepRound(algorithm, "cpu", chunk_bytes=1)  # one client a call
  for got, want in zip(_leaves(_run(chunked)), _leaves(_run(whole))):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_padding_adds_all_padding_batches_at_the_end():
  x, y, mask = next(lockstep.padded_chunks(ROUNDS[0], 2**30, 0))
  assert x.shape == (3, 4, BATCH, DIM) and y.shape == mask.shape == (3, 4, BATCH)
  assert mask.sum(axis=(1, 2)).tolist() == [5, 13, 3]
  assert mask[2, 1:].sum() == 0 and np.all(x[2, 1:] == 0)
  np.testing.assert_array_equal(x[1], ROUNDS[0][1]["x"])


def _build(algorithm, name="lockstep"):
  runtime = runtime_of(name)
  params = runtime.params(device="cpu")
  assert runtime.supports(algorithm, params) is None
  return runtime.build(algorithm, params, RuntimeContext())


@pytest.mark.parametrize("algorithm_name,params,reason", [
    ("scaffold", {}, "its clients keep state between rounds"),
    ("fedavg", {"gradient_accumulation": {"steps": 2}},
     "the algorithm does not say what its clients compute (lockstep runs fedavg, fedprox"
     " and fedsgd without gradient accumulation)"),
])
def test_an_algorithm_it_cannot_run_is_one_line(algorithm_name, params, reason):
  model = builders.task_model("logistic", input_shape=(DIM,), num_classes=CLASSES)
  algorithm = builders.algorithm(algorithm_name, params, model, batch_size=BATCH,
                                 num_clients=10)
  with pytest.raises(UserError) as e:
    _build(algorithm)
  assert str(e.value) == f"runtime.name: lockstep cannot run this round: {reason}"


def test_a_model_it_cannot_batch_is_one_line(tff_runtime):
  model = builders.task_model("cnn", input_shape=(16,), num_classes=CLASSES, filters=(2, 2),
                              dense=4)
  algorithm = builders.algorithm("fedavg", {}, model, batch_size=BATCH)
  with pytest.raises(UserError) as e:
    _build(algorithm)
  assert str(e.value) == (
      "runtime.name: lockstep cannot run this round: TensorFlow cannot batch the model's"
      " training step over clients: Input \"filter\" of op 'Conv2D' expected to be loop"
      " invariant")


def test_a_broadcast_encoder_is_refused_in_one_line():
  model = builders.task_model("logistic", input_shape=(DIM,), num_classes=CLASSES)
  algorithm = builders.algorithm("fedavg", {}, model, batch_size=BATCH, compression=(
      parse_compression({"broadcast": ENCODER["aggregation"]})))
  assert lockstep.unsupported(algorithm) == (
      "clients train from the server's weights: a broadcast encoder is not supported")


def test_auto_never_picks_lockstep(tff_runtime):
  algorithm = _algorithm("logistic", "fedavg", False)
  assert isinstance(_build(algorithm, "auto"), inprocess.InProcessProcess)


RUN = {"name": "toy", "seed": 2, "rounds": 2, "clients_per_round": 3,
       "data": {"name": "digits", "num_clients": 6, "batch_size": 16},
       "model": {"name": "mlp", "hidden": [8]},
       "algorithm": {"name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": 0.3}}}


@pytest.mark.slow
def test_a_run_named_lockstep_equals_inprocess_and_refuses_in_one_line(tff_runtime, tmp_path):
  import fedsim
  got = fedsim.run({**RUN, "runtime": {"name": "lockstep", "device": "cpu"}},
                   logdir=tmp_path / "lockstep", progress=False)
  want = fedsim.run({**RUN, "runtime": {"name": "inprocess", "device": "cpu"}},
                    logdir=tmp_path / "inprocess", progress=False)
  for g, w in zip(got.final_weights, want.final_weights, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  with pytest.raises(UserError, match="^runtime.name: lockstep cannot run this round: its"
                     " clients keep state between rounds$"):
    fedsim.run({**RUN, "algorithm": {"name": "scaffold"}, "runtime": {"name": "lockstep"}},
               logdir=tmp_path / "scaffold", progress=False)
