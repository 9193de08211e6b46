"""The `inprocess` runtime gives what TFF's runtime gives, and refuses what it cannot run."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow_federated as tff

from fedsim.compression import parse_compression
from fedsim.errors import UserError
from fedsim.learning import local_training
from fedsim.runtime import devices, inprocess
from tests.learning import builders


def _clients(seed, steps, batch=2, dim=3, classes=2):
  """Clients with `steps[i]` batches each; the last batch of each is half padding."""
  rng = np.random.default_rng(seed)
  out = []
  for n in steps:
    mask = np.ones((n, batch), np.float32)
    mask[-1, 1:] = 0.0
    out.append({"x": rng.normal(size=(n, batch, dim)).astype(np.float32),
                "y": rng.integers(0, classes, (n, batch)).astype(np.int32), "mask": mask})
  return out


ROUNDS = [_clients(1, [2, 3, 1]), _clients(2, [1, 4])]


def _run(process, rounds=ROUNDS):
  state = process.initialize()
  measurements = []
  for data in rounds:
    state, m = process.next(state, data)
    measurements.append(m)
  return state, measurements


def _leaves(value):
  return [np.asarray(v) for v in tff.structure.flatten(tff.structure.from_container(
      value, recursive=True))]


# chunk_bytes=1: one graph call per client, as for clients too big to batch.
@pytest.mark.parametrize("params,compression,chunk_bytes", [
    ({"client_optimizer": {"name": "sgd", "learning_rate": 0.4}}, None, 1),
    ({"client_optimizer": {"name": "adam", "learning_rate": 0.05},
      "server_optimizer": {"name": "sgd", "learning_rate": 0.7, "momentum": 0.9},
      "client_weighting": "uniform", "gradient_accumulation": {"steps": 2}}, None, 2**26),
    ({"client_optimizer": {"name": "sgd", "learning_rate": 0.4}},
     {"broadcast": {"encoder": "uniform", "bits": 8, "min_elements": 1,
                    "rounding": "deterministic"},
      "aggregation": {"encoder": "uniform", "bits": 8, "min_elements": 1,
                      "rounding": "deterministic"}}, 2**26),
])
def test_same_state_and_metrics_as_tff_runtime(tff_runtime, params, compression, chunk_bytes):
  model = builders.task_model(num_classes=2)
  alg = builders.algorithm("fedavg", params, model,
                           compression=parse_compression(compression))
  expected_state, expected_metrics = _run(alg.process)
  local = inprocess.InProcessProcess(alg.process, "cpu", chunk_bytes=chunk_bytes)
  state, metrics = _run(local)

  assert type(state) is type(expected_state)
  assert metrics[0].keys() == expected_metrics[0].keys()
  for got, want in [(state, expected_state), (metrics, expected_metrics)]:
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
      assert g.dtype == w.dtype and g.shape == w.shape
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  # Each client's last batch holds one example: 3 + 5 + 1 examples in round 1.
  assert float(metrics[0]["client_work"]["num_examples"]) == 3 + 5 + 1
  assert not np.allclose(alg.model_weights(state).trainable[0],
                         model.initial_weights.trainable[0])


def test_chunks_merged_equal_one_pass():
  """`merge` of per-chunk accumulators (as a cluster runs them) equals one pass."""
  model = builders.task_model(num_classes=2)
  alg = builders.algorithm("fedavg", {"client_optimizer": {"name": "sgd", "learning_rate": 0.4}},
                           model)
  process = inprocess.InProcessProcess(alg.process, "cpu")
  state = process.initialize()
  data = ROUNDS[0] + ROUNDS[1]
  whole, _ = process.next(state, data)
  client_input, zero = process.start(state)
  parts = [process.run_clients(client_input, zero, data[:2]),
           process.run_clients(client_input, zero, data[2:])]
  split, _ = process.finish(state, process.merge(*parts))
  for g, w in zip(_leaves(split), _leaves(whole)):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
  assert not np.allclose(_leaves(whole)[0], _leaves(state)[0])


def test_initialize_matches_tff_runtime(tff_runtime):
  alg = builders.algorithm("fedavg", {}, builders.task_model())
  expected = alg.process.initialize()
  got = inprocess.InProcessProcess(alg.process, "cpu").initialize()
  assert type(got) is type(expected)
  for g, w in zip(_leaves(got), _leaves(expected)):
    np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("requested,gpus,device", [
    ("auto", [], "/CPU:0"), ("auto", ["gpu0"], "/GPU:0"), ("cpu", ["gpu0"], "/CPU:0"),
    ("cpu", [], "/CPU:0"), ("gpu", ["gpu0", "gpu1"], "/GPU:0"),
])
def test_select_device(requested, gpus, device):
  assert devices.select_device(requested, gpus) == device


@pytest.mark.parametrize("visible,device", [([], "/CPU:0"), (["gpu0"], "/GPU:0")])
def test_select_device_asks_tensorflow(monkeypatch, visible, device):
  # Whatever this machine has: 'auto' follows what TensorFlow reports.
  asked = []
  monkeypatch.setattr(devices.tf.config, "list_physical_devices",
                      lambda kind: asked.append(kind) or visible)
  assert devices.select_device("auto") == device
  assert asked == ["GPU"]


@pytest.mark.parametrize("requested,message", [
    ("gpu", "runtime.device: 'gpu' but TensorFlow sees no GPU"),
    ("tpu", "runtime.device: unknown device 'tpu'"),
])
def test_select_device_rejects(requested, message):
  with pytest.raises(UserError, match=message):
    devices.select_device(requested, [])


def _two_phase_process():
  """Broadcasts a sum of client values back for a second aggregation: no MapReduceForm."""
  @tff.federated_computation()
  def init():
    return tff.federated_value(0.0, tff.SERVER)

  @tff.federated_computation(tff.FederatedType(np.float32, tff.SERVER),
                             tff.FederatedType(np.float32, tff.CLIENTS))
  def next_fn(state, data):
    del state
    total = tff.federated_sum(data)
    again = tff.federated_broadcast(total)
    return tff.federated_sum(tff.federated_map(
        tff.tensorflow.computation(lambda a, b: a + b, np.float32, np.float32),
        (again, data)))

  return tff.templates.IterativeProcess(init, next_fn)


def _stateful_clients_process():
  @tff.federated_computation()
  def init():
    return tff.federated_value(0.0, tff.CLIENTS)

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS),
                             tff.FederatedType(np.float32, tff.CLIENTS))
  def next_fn(state, data):
    return tff.federated_map(
        tff.tensorflow.computation(lambda a, b: a + b, np.float32, np.float32), (state, data))

  return tff.templates.IterativeProcess(init, next_fn)


def _tf_data_process():
  def model_fn():
    import tensorflow as tf
    keras_model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(3,)),
                                       tf.keras.layers.Dense(2)])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=(tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None], tf.int32)))

  return tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1))


@pytest.mark.parametrize("build,message", [
    (_two_phase_process, "no MapReduceForm"),
    (_stateful_clients_process, "state@SERVER"),
    (_tf_data_process, "client data must be tensors"),
])
def test_processes_it_cannot_run_are_refused(build, message):
  with pytest.raises(inprocess.NotCompilable, match=message) as error:
    inprocess.InProcessProcess(build(), "cpu")
  assert "\n" not in str(error.value)  # one line, for the run loop's notice


def test_tensorflow_function_matches_tff_runtime(tff_runtime):
  """The evaluator's kind of computation: (weights, batches) -> sums."""
  model = builders.task_model()

  @tff.tensorflow.computation(model.weights_type, model.client_data_type(2))
  def stats(model_weights, batches):
    return local_training.evaluate(model.predict, model_weights.trainable, batches)

  batches = _clients(3, [4])[0]
  expected = stats(model.initial_weights, batches)
  got = inprocess.tensorflow_function(stats, "cpu")(model.initial_weights, batches)
  assert type(got) is type(expected)
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6)
  assert float(got[2]) == 4 * 2 - 1


def test_packer_builds_the_containers_tff_builds():
  """The cached plan gives what `tff.types.type_to_py_container` gives, containers included."""
  import collections
  import tensorflow as tf
  from fedsim.backend import computations
  weights = tff.learning.models.ModelWeights(trainable=(np.zeros(2, np.float32),),
                                             non_trainable=())
  value = tff.templates.MeasuredProcessOutput(
      state=collections.OrderedDict(w=weights, step=np.int32(3)),
      result=[np.float32(1.5), (np.ones(3, np.float32),)],
      measurements=collections.OrderedDict(loss=np.float32(0.25)))
  from tensorflow_federated.python.core.impl.types import type_conversions
  type_spec = type_conversions.infer_type(value)
  leaves = [tf.constant(v) for v in _leaves(value)]
  expected = tff.types.type_to_py_container(
      tff.structure.pack_sequence_as(tff.structure.from_container(value, recursive=True),
                                     [v.numpy() for v in leaves]), type_spec)
  got = computations.packer(type_spec)(leaves)
  assert repr(got) == repr(expected)
  assert type(got.state["w"]) is type(expected.state["w"])
  assert all(type(a) is type(b) and np.array_equal(a, b)
             for a, b in zip(_leaves(got), _leaves(expected)))


def _mixed_value():
  import collections
  weights = tff.learning.models.ModelWeights(
      trainable=(np.arange(2, dtype=np.float32), np.full((2, 2), 7.0, np.float32)),
      non_trainable=())
  return tff.templates.MeasuredProcessOutput(
      state=collections.OrderedDict(w=weights, step=np.int32(3)),
      result=[np.float32(1.5), (np.ones(3, np.float32),)],
      measurements=tff.structure.Struct([("loss", np.float32(0.25)), (None, np.int64(9))]))


def test_flatten_gives_the_leaves_in_tffs_order():
  """The cached flatten plan reads attrs, namedtuple, mapping, list and Struct values."""
  from tensorflow_federated.python.core.impl.types import type_conversions
  from fedsim.backend import computations
  value = _mixed_value()
  type_spec = type_conversions.infer_type(value)
  got = computations.flatten(value, type_spec)
  assert [np.asarray(v).tolist() for v in got] == [v.tolist() for v in _leaves(value)]
  assert [np.asarray(v).tolist() for v in computations.flatten(value, type_spec)] == [
      v.tolist() for v in got]  # the second call runs the cached plan
  assert computations.flatten(np.float32(2.0), tff.TensorType(np.float32)) == [2.0]


def test_eager_tensors_keep_values_and_take_the_specs_dtypes():
  import tensorflow as tf
  from fedsim.backend import computations
  specs = [tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.int32),
           tf.TensorSpec([2], tf.int32), tf.TensorSpec([], tf.float32)]
  values = [np.array([0.5, -2.0], np.float32), np.int32(4), np.array([1, 2], np.int64), 3]
  got = computations.eager_tensors(values, specs)
  assert [t.dtype for t in got] == [tf.float32, tf.int32, tf.int32, tf.float32]
  assert [t.numpy().tolist() for t in got] == [[0.5, -2.0], 4, [1, 2], 3.0]


def test_a_rounds_result_shares_no_memory_with_its_inputs():
  """Tensors may alias the NumPy inputs (see `eager_tensors`), but what a round
  returns never does: changing the old state or the clients' arrays afterwards
  leaves the new state as it was."""
  from fedsim.backend import computations
  alg = builders.algorithm("fedavg", {"client_optimizer": {"name": "sgd", "learning_rate": 0.4}},
                           builders.task_model(num_classes=2))
  process = inprocess.InProcessProcess(alg.process, "cpu")
  state, data = process.initialize(), _clients(7, [2, 3])
  new_state, _ = process.next(state, data)
  leaves = computations.flatten(new_state, process._state_type)
  before = [np.array(v, copy=True) for v in leaves]
  for value in [*computations.flatten(state, process._state_type),
                *(a for client in data for a in client.values())]:
    if isinstance(value, np.ndarray) and value.flags.writeable:
      value[...] = 99
  assert all(np.array_equal(a, b) for a, b in zip(leaves, before))


def test_direct_call_equals_the_concrete_functions_own_call():
  import tensorflow as tf
  from fedsim.backend import computations

  @tf.function(input_signature=((tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.float32)),
                                tf.TensorSpec([None], tf.float32)))
  def f(pair, rest):
    return (pair[0] * pair[1], tf.reduce_sum(rest) + pair[1])

  concrete = f.get_concrete_function()
  args = [tf.constant([1.0, 2.0]), tf.constant(3.0), tf.constant([4.0, 5.0, 6.0])]
  expected = [[3.0, 6.0], 18.0]
  assert [t.numpy().tolist() for t in computations.direct_call(concrete)(args)] == expected

  class Public:  # a ConcreteFunction without TF's private entry point: the public call
    structured_input_signature = concrete.structured_input_signature
    captured_inputs = concrete.captured_inputs

    def __call__(self, *a):
      return concrete(*a)

  assert [t.numpy().tolist() for t in computations.direct_call(Public())(args)] == expected


def test_a_state_leaf_of_the_wrong_shape_is_refused():
  from fedsim.backend import computations
  alg = builders.algorithm("fedavg", {"client_optimizer": {"name": "sgd", "learning_rate": 0.4}},
                           builders.task_model(num_classes=2))
  process = inprocess.InProcessProcess(alg.process, "cpu")
  leaves = computations.flatten(process.initialize(), process._state_type)
  shape = np.shape(leaves[0])
  leaves[0] = np.zeros((1, 7), np.float32)
  bad = computations.pack(leaves, process._state_type)
  with pytest.raises(ValueError, match=rf"state leaf has shape \(1, 7\), the state type says"
                                       rf" \({shape[0]}, {shape[1]}\)"):
    process.next(bad, ROUNDS[0])
