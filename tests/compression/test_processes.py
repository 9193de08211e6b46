"""Encoded broadcast and mean as TFF processes, and what crosses the wire in FedAvg.

Wire sizes are read from the compiled MapReduceForm, as fedsim measures them:
server -> client = `prepare` result, client -> server = `work` result[0].
"""

from __future__ import annotations

import collections
import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.backend.mapreduce import compile_form
from fedsim.compression import ENCODERS, parse_direction, register_encoder
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.broadcast import build_encoded_broadcast
from fedsim.compression.mean import build_encoded_mean


@pytest.fixture(scope="module", autouse=True)
def _runtime(tff_runtime):
  # Computations here run on fedsim's session worker (see tests/conftest.py).
  yield tff_runtime


def wire_bits(value_type: tff.Type) -> int:
  """Bits of one value of `value_type`: sum of num_elements x dtype bits."""
  return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize * 8
             for dtype, shape in tensor_leaves(value_type))


def tensor_leaves(value_type: tff.Type) -> list[tuple[str, tuple[int, ...]]]:
  """(dtype name, shape) of every tensor in `value_type`; fails on unknown dims."""
  if isinstance(value_type, tff.FederatedType):
    return tensor_leaves(value_type.member)
  if isinstance(value_type, tff.StructType):
    return [leaf for member in value_type for leaf in tensor_leaves(member)]
  assert isinstance(value_type, tff.TensorType), value_type
  assert None not in value_type.shape, f"dynamic shape in {value_type}"
  return [(np.dtype(value_type.dtype).name, tuple(value_type.shape))]


def _model_fn(inputs: int = 200) -> tff.learning.models.VariableModel:
  # Dense `inputs` -> 100: a 20,000 (or 10,000) element kernel, encoded at
  # min_elements 10000, and a 100-element bias (sent as float32).
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(inputs,)), tf.keras.layers.Dense(100)])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(),
      input_spec=(tf.TensorSpec([None, inputs], tf.float32),
                  tf.TensorSpec([None, 100], tf.float32)))


def _weights_type(inputs: int = 200) -> tff.learning.models.ModelWeights:
  return tff.learning.models.ModelWeights(
      trainable=[tff.TensorType(np.float32, [inputs, 100]), tff.TensorType(np.float32, [100])],
      non_trainable=[])


WEIGHTS_TYPE = _weights_type()
UNIFORM8 = parse_direction({"encoder": "uniform", "bits": 8}, "compression.broadcast")

# Outside the encoded kernel, the prepare result holds the float32 bias and the
# client learning rate; work[0] holds the float32 bias, the loss (sum, count as
# two float32), num_examples and num_batches (int64) and the client weight.
PREPARE_OTHER = [("float32", (100,)), ("float32", ())]
WORK_OTHER = [("float32", ()), ("float32", ()), ("int64", ()), ("int64", ()),
              ("float32", (100,)), ("float32", ())]


def _map_reduce_form(direction, inputs: int = 200) -> tff.backends.mapreduce.MapReduceForm:
  process = tff.learning.algorithms.build_weighted_fed_avg(
      lambda: _model_fn(inputs), client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      model_distributor=build_encoded_broadcast(_weights_type(inputs), direction),
      model_aggregator=build_encoded_mean(direction))
  return compile_form(process.next)  # as a run compiles it


@pytest.mark.parametrize("inputs, config, kernel, kernel_bits", [
    # 8-bit values are packed 28 bits to an int32: ceil(20000 * 8 / 28) = 5715,
    # plus min and max: 5715 * 32 + 64 = 182,944 bits (vs 640,000 as float32).
    (200, {"encoder": "uniform", "bits": 8},
     [("int32", (5715, 1)), ("float32", (2,))], 182_944),
    # Hadamard pads 20000 to 32768 values: ceil(32768 * 8 / 28) = 9363 int32s
    # and min/max (299,680 bits). The rotation's int32[2] seed, a fingerprint
    # of the encoded value, travels with it, both ways (64 bits); the server
    # sends no seed for the clients' rotations.
    (200, {"encoder": "hadamard", "bits": 8},
     [("int32", (9363, 1)), ("float32", (2,)), ("int32", (2,))], 299_680 + 64),
    # The 100x100 kernels are `-m long` (~15 s): the 200x100 ones above prove the
    # form both ways, test_every_size_compiles_with_static_encoded_shapes below
    # and test_encoders.py's sweep keep the sizes (16384 among them) static.
    # A 100x100 kernel: ceil(10000 * 8 / 28) = 2858 int32s (91,520 bits).
    pytest.param(100, {"encoder": "uniform", "bits": 8},
                 [("int32", (2858, 1)), ("float32", (2,))], 91_520, marks=pytest.mark.long),
    # Hadamard pads 10000 to 16384: ceil(16384 * 8 / 28) = 4682 int32s
    # (149,888 bits with min/max). This size once left the packed values
    # int32[None, 1] in the compiled graph (see test_encoders.py).
    pytest.param(100, {"encoder": "hadamard", "bits": 8},
                 [("int32", (4682, 1)), ("float32", (2,)), ("int32", (2,))], 149_888 + 64,
                 marks=pytest.mark.long),
    (200, None, [("float32", (200, 100))], 640_000),
])
def test_fed_avg_sends_the_encoded_form_both_ways(inputs, config, kernel, kernel_bits):
  # The kernel crosses the wire in the same encoded form both ways.
  direction = None if config is None else parse_direction(config, "compression.broadcast")
  mrf = _map_reduce_form(direction, inputs)
  prepare = mrf.prepare.type_signature.result
  work = mrf.work.type_signature.result[0]
  # An encoded upload's int32 round counter goes down with its encoder
  # parameters (the clients fold it into their noise).
  round_down = [] if config is None else [("int32", ())]
  assert sorted(tensor_leaves(prepare)) == sorted(kernel + PREPARE_OTHER + round_down)
  assert sorted(tensor_leaves(work)) == sorted(kernel + WORK_OTHER)
  # Besides the kernel: the float32 bias (3,200 bits) and a float32 each way
  # (the learning rate down, the client weight up), plus 192 bits of loss sum
  # and count and example and batch counts up.
  assert wire_bits(prepare) == kernel_bits + 3_200 + 32 + 32 * len(round_down)
  assert wire_bits(work) == kernel_bits + 3_200 + 192 + 32


# Sizes around powers of two (Hadamard pads them to 2048, 4096, 16384, 32768, 131072).
SWEEP_SIZES = [2048, 2049, 8193, 16384, 16385, 65537]


def _broadcast_then_mean_form(direction, sizes: list[int]) -> tff.backends.mapreduce.MapReduceForm:
  """MapReduceForm of a round that broadcasts one float32 vector per size,
  encoded, and averages the clients' vectors, encoded."""
  value_type = tff.to_type([(np.float32, [n]) for n in sizes])
  distributor = build_encoded_broadcast(value_type, direction)
  mean = build_encoded_mean(direction, weighted=False).create(value_type)

  # State: the two processes' states and the value to broadcast.
  state_type = tff.FederatedType([distributor.initialize.type_signature.result.member,
                                  mean.initialize.type_signature.result.member,
                                  value_type], tff.SERVER)

  @tff.tensorflow.computation(value_type, value_type)
  def add(x, y):
    return [a + b for a, b in zip(x, y)]

  @tff.federated_computation(state_type, tff.FederatedType(value_type, tff.CLIENTS))
  def next_fn(state, client_values):
    sent = distributor.next(state[0], state[2])
    averaged = mean.next(state[1], tff.federated_map(add, (sent.result, client_values)))
    return (tff.federated_zip((sent.state, averaged.state, averaged.result)),
            tff.federated_value((), tff.SERVER))

  return compile_form(next_fn)


# Hadamard's form holds uniform's (its quantized values, packed) plus padding and
# the rotation seeds; `-m long` compiles uniform's alone too.
@pytest.mark.parametrize("name", [pytest.param("uniform", marks=pytest.mark.long), "hadamard"])
def test_every_size_compiles_with_static_encoded_shapes(name):
  direction = parse_direction({"encoder": name, "bits": 8, "min_elements": 1}, "c.a")
  mrf = _broadcast_then_mean_form(direction, SWEEP_SIZES)
  rotate = name == "hadamard"
  padded = [1 << (n - 1).bit_length() if rotate else n for n in SWEEP_SIZES]
  encoded = [("int32", (-(-p * 8 // 28), 1)) for p in padded] + [("float32", (2,))] * len(padded)
  # Each rotated value carries its int32[2] seed, both ways; the unweighted
  # mean also sums an int32 count of clients.
  seeds = [("int32", (2,))] * len(padded) if rotate else []
  # The mean's int32 round counter goes down too.
  assert sorted(tensor_leaves(mrf.prepare.type_signature.result)) == sorted(
      encoded + seeds + [("int32", ())])
  assert sorted(tensor_leaves(mrf.work.type_signature.result[0])) == sorted(
      encoded + seeds + [("int32", ())])
  encoded_bits = sum(-(-p * 8 // 28) * 32 + 64 for p in padded) + 64 * len(seeds)
  assert wire_bits(mrf.prepare.type_signature.result) == encoded_bits + 32
  assert wire_bits(mrf.work.type_signature.result[0]) == encoded_bits + 32


def _model_weights(seed: int) -> tff.learning.models.ModelWeights:
  rng = np.random.default_rng(seed)
  return tff.learning.models.ModelWeights(
      trainable=[rng.normal(size=[200, 100]).astype(np.float32),
                 rng.normal(size=[100]).astype(np.float32)],
      non_trainable=[])


def test_broadcast_delivers_the_decoded_model_to_every_client():
  process = build_encoded_broadcast(WEIGHTS_TYPE, UNIFORM8)

  @tff.federated_computation(process.initialize.type_signature.result,
                             tff.FederatedType(WEIGHTS_TYPE, tff.SERVER),
                             tff.FederatedType(np.float32, tff.CLIENTS))
  def deliver(state, value, client_marker):
    # `client_marker` only fixes the number of clients (3).
    delivered = process.next(state, value).result
    return tff.federated_zip((delivered, client_marker))

  weights = _model_weights(5)
  received = deliver(process.initialize(), weights, [0.0, 1.0, 2.0])
  assert len(received) == 3
  kernel, bias = weights.trainable
  step = (kernel.max() - kernel.min()) / 255
  for client_weights, _ in received:
    client_kernel, client_bias = client_weights.trainable
    # Stochastic rounding: less than one quantization step off, plus float32 slack.
    assert np.abs(client_kernel - kernel).max() < step + 1e-6 * np.abs(kernel).max()
    np.testing.assert_array_equal(client_bias, bias)
    # One encoding on the server: every client decodes the same value.
    np.testing.assert_array_equal(client_kernel, received[0][0].trainable[0])


VALUE_TYPE = tff.to_type([(np.float32, [200, 100]), (np.float32, [100])])


def _client_values(count: int) -> list[list[np.ndarray]]:
  rng = np.random.default_rng(7)
  return [[rng.normal(loc=i, size=[200, 100]).astype(np.float32),
           rng.normal(size=[100]).astype(np.float32)] for i in range(count)]


@pytest.mark.parametrize("rounding, steps_off", [("stochastic", 1.0), ("deterministic", 0.5)])
def test_weighted_encoded_mean_matches_numpy(rounding, steps_off):
  direction = parse_direction({"encoder": "uniform", "bits": 8, "rounding": rounding}, "c.a")
  process = build_encoded_mean(direction).create(VALUE_TYPE, tff.TensorType(np.float32))
  values, weights = _client_values(3), np.array([1.0, 2.0, 5.0], np.float32)
  output = process.next(process.initialize(), values, list(weights))
  kernels = np.stack([v[0] for v in values])
  expected = np.tensordot(weights, kernels, axes=1) / weights.sum()
  # Each client quantizes its weighted kernel w * x over its own range.
  steps = [np.ptp(w * k) / 255 for w, k in zip(weights, kernels)]
  bound = steps_off * sum(steps) / weights.sum() + 1e-5 * np.abs(expected).max()
  error = np.abs(output.result[0] - expected).max()
  assert error <= bound
  assert error > 0.01 * bound   # the kernel really was quantized
  expected_bias = np.tensordot(weights, np.stack([v[1] for v in values]), axes=1) / weights.sum()
  np.testing.assert_allclose(output.result[1], expected_bias, rtol=1e-6, atol=1e-6)


def test_unweighted_encoded_mean_matches_numpy():
  process = build_encoded_mean(UNIFORM8, weighted=False).create(VALUE_TYPE)
  values = _client_values(2)
  output = process.next(process.initialize(), values)
  kernels = np.stack([v[0] for v in values])
  bound = sum(np.ptp(k) / 255 for k in kernels) / 2 + 1e-5 * np.abs(kernels).max()
  assert np.abs(output.result[0] - kernels.mean(axis=0)).max() <= bound
  np.testing.assert_allclose(output.result[1], np.mean([v[1] for v in values], axis=0),
                             rtol=1e-6, atol=1e-6)


@te_api.tf_style_encoding_stage
class HalfPrecisionStage(te_api.EncodingStageInterface):
  """Sends float32 values as float16 (a user-written stage)."""

  @property
  def name(self):
    return "half_precision"

  @property
  def compressible_tensors_keys(self):
    return ["half_values"]

  @property
  def commutes_with_sum(self):
    return False

  @property
  def decode_needs_input_shape(self):
    return False

  def get_params(self):
    return collections.OrderedDict(), collections.OrderedDict()

  def encode(self, x, encode_params):
    return collections.OrderedDict(half_values=tf.cast(x, tf.float16))

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
    return tf.cast(encoded_tensors["half_values"], tf.float32)


@dataclasses.dataclass(frozen=True)
class HalfParams:
  min_magnitude: float = 0.0


def test_user_registered_encoder_end_to_end(monkeypatch):
  # Register into a copy so that other tests see only the built-in encoders.
  monkeypatch.setattr(ENCODERS, "_entries", dict(ENCODERS._entries))

  @register_encoder("half", params=HalfParams)
  def half(params):
    assert params == HalfParams(0.5)
    return HalfPrecisionStage()

  direction = parse_direction({"encoder": "half", "min_magnitude": 0.5, "min_elements": 100},
                              "compression.aggregation")
  mrf = _map_reduce_form(direction)
  # Down: + the learning rate and the mean's int32 round counter.
  assert wire_bits(mrf.prepare.type_signature.result) == 20_100 * 16 + 32 + 32
  assert wire_bits(mrf.work.type_signature.result[0]) == 20_100 * 16 + 192 + 32

  process = build_encoded_mean(direction, weighted=False).create(VALUE_TYPE)
  values = _client_values(2)
  output = process.next(process.initialize(), values)
  for i in range(2):
    halves = [v[i].astype(np.float16).astype(np.float32) for v in values]
    np.testing.assert_allclose(output.result[i], (halves[0] + halves[1]) / 2, rtol=1e-6)


@pytest.mark.parametrize("bits", [8, 16])
def test_hadamard_mean_is_the_mean_within_the_rotated_quantization_error(tff_runtime, bits):
  # Each client rotates with its own signs (an orthonormal map after padding
  # 3000 -> 4096) and quantizes to nearest: the L2 error of one client's decoded
  # value is that of its rotated quantization, at most sqrt(4096) * step / 2 with
  # step = (max - min) / (2**bits - 1) of its rotated vector. The mean's error is
  # at most the mean of the three.
  direction = parse_direction({"encoder": "hadamard", "bits": bits, "min_elements": 1,
                               "rounding": "deterministic"}, "c.a")
  value_type = tff.TensorType(np.float32, [3000])
  process = build_encoded_mean(direction, weighted=False).create(value_type)
  rng = np.random.default_rng(11)
  clients = [rng.normal(size=3000).astype(np.float32) * scale for scale in (0.5, 1.0, 3.0)]
  got = process.next(process.initialize(), clients).result
  want = np.mean(clients, axis=0)
  # The rotated vector of x has entries with |.| <= ||x||_2; max - min <= 2 ||x||_2.
  bound = np.mean([np.sqrt(4096) * (2 * np.linalg.norm(c)) / (2**bits - 1) / 2
                   for c in clients])
  error = float(np.linalg.norm(got - want))
  assert error <= bound
  assert error > 0  # it is quantized, not sent as is
