"""Communication sizes read from the compiled process."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from fedsim.compression import parse_compression
from fedsim.sizing import ClientWireBits, SizeInfo
from fedsim.sizing.mapreduce_form import client_wire_bits
from tests.learning import builders

METRICS_BITS = 3 * 32  # loss sum, correct predictions, examples (float32 each)
WEIGHT_BITS = 32


@functools.cache
def _model(name, input_shape, hidden=None):
  """One 10-class model per architecture for the module: sizing reads its types,
  never changes it, and building one traces Keras."""
  params = {} if hidden is None else {"hidden": list(hidden)}
  return builders.task_model(name, input_shape, 10, **params)


@pytest.fixture(scope="module", autouse=True)
def _free_models():
  yield
  _model.cache_clear()


def _wire(model, compression=None, weighting="num_examples"):
  alg = builders.algorithm("fedavg", {"client_weighting": weighting}, model, batch_size=4,
                           compression=compression)
  return client_wire_bits(alg.process, alg.upload_extras_types)


@pytest.mark.parametrize("model,input_shape,hidden,num_params", [
    ("cnn", (28, 28, 1), None, 1_663_370),
    ("mlp", (784,), (200, 200), 199_210),
    ("logistic", (64,), None, 650),
])
def test_uncompressed_model_part_is_params_times_32(model, input_shape, hidden, num_params):
  task_model = _model(model, input_shape, hidden)
  assert task_model.num_params == num_params
  wire = _wire(task_model)
  assert wire.broadcast == wire.broadcast_model == num_params * 32
  assert wire.aggregate_model == num_params * 32
  assert wire.aggregate_other == METRICS_BITS + WEIGHT_BITS


def test_uniform_weighting_sends_no_weight():
  wire = _wire(_model("logistic", (64,)), weighting="uniform")
  assert wire.aggregate_other == METRICS_BITS
  # but TFF's unweighted mean counts clients: each sends an int32 1 with its update.
  assert wire.aggregate_model == 650 * 32 + 32
  assert wire.broadcast == 650 * 32


def _packed_bits(n, bits):
  """tensor_encoding packs `bits`-bit integers 28 to an int32, plus float32 min and max."""
  return math.ceil(n * bits / 28) * 32 + 2 * 32


# 4 bits sizes through the same code as 8 (the paper encoders below pack 1, 2
# and 4 bits by default): a CNN build more, so `-m long`.
@pytest.mark.parametrize("bits", [8, pytest.param(4, marks=pytest.mark.long)])
def test_uniform_quantization_sizes_cnn(bits):
  model = _model("cnn", (28, 28, 1))
  spec = parse_compression({
      "broadcast": {"encoder": "uniform", "bits": bits, "min_elements": 10000},
      "aggregation": {"encoder": "uniform", "bits": bits, "min_elements": 10000}})
  wire = _wire(model, spec)
  sizes = [w.size for w in model.initial_weights.trainable]
  expected = sum(_packed_bits(n, bits) if n >= 10000 else n * 32 for n in sizes)
  assert wire.broadcast_model == expected
  assert wire.aggregate_model == expected
  assert 1_663_370 * 32 / expected > (3.4 if bits == 8 else 6.5)


def test_size_info_accumulates_rounds():
  info = SizeInfo(per_client=ClientWireBits(broadcast=100, broadcast_model=90,
                                            aggregate=50, aggregate_model=40))
  first = info.round_metrics(broadcast_clients=3, aggregated_clients=2)
  second = info.round_metrics(broadcast_clients=4, aggregated_clients=4)
  assert first["broadcast_bits"] == 300 and first["aggregate_bits"] == 100
  assert second["cumulative_broadcast_bits"] == 700
  assert second["cumulative_aggregate_bits"] == 300
  assert second["aggregate_other_bits_per_client"] == 10
  assert info.broadcast_history == [300, 400] and info.aggregate_bits == 300


def _encode_wire(model, stage):
  alg = builders.algorithm("fedavg", {}, model, batch_size=4,
                           aggregation=[stage], broadcast=[stage])
  return client_wire_bits(alg.process, alg.upload_extras_types)


def test_topk_sends_k_values_and_k_int32_indices_per_tensor():
  model = _model("mlp", (784,), (200, 200))
  wire = _encode_wire(model, {"name": "encode", "encoder": "topk", "fraction": 0.01})
  sizes = [w.size for w in model.initial_weights.trainable]
  # k = ceil(0.01 n) float32 values + k int32 indices for 156800 and 40000;
  # the rest (below min_elements 10000) as float32.
  expected = sum(math.ceil(0.01 * n) * (32 + 32) if n >= 10000 else n * 32 for n in sizes)
  assert expected == (1568 + 400) * 64 + (2000 + 200 + 200 + 10) * 32
  assert wire.aggregate_model == wire.broadcast_model == expected


def _pow2(n):
  return 1 << (n - 1).bit_length()


def _packed(count, bits):
  return math.ceil(count * bits / 28) * 32


# What each encoder's encoded form holds for an n-element tensor (see
# fedsim/compression/encoder_catalog.py): packed symbols, float32 scales, int32 seeds.
ENCODED_BITS = {
    "qsgd": lambda n: _packed(n, 4) + 32,             # levels 7: 15 symbols, 4 bits
    "qsgd bucket 512": lambda n: _packed(-(-n // 512) * 512, 4) + -(-n // 512) * 32,
    "terngrad": lambda n: _packed(n, 2) + 32,
    "sign": lambda n: _packed(n, 1) + 32,
    "drive": lambda n: _packed(_pow2(n), 1) + 32 + 64,
    "randk": lambda n: math.ceil(0.01 * n) * 32 + 64,
    "kashin": lambda n: _packed(_pow2(n) * (2 if n > 0.85 * _pow2(n) else 1), 2) + 64 + 64,
}


@pytest.mark.parametrize("encoder", sorted(ENCODED_BITS))
def test_paper_encoders_size_to_what_they_encode(encoder):
  model = _model("mlp", (64,), (200,))   # kernels 12800 and 2000
  name, *bucket = encoder.split(" bucket ")
  stage = {"name": "encode", "encoder": name, **({"bucket": int(bucket[0])} if bucket else {})}
  wire = _encode_wire(model, stage)
  sizes = [w.size for w in model.initial_weights.trainable]
  expected = sum(ENCODED_BITS[encoder](n) if n >= 10000 else n * 32 for n in sizes)
  assert wire.aggregate_model == wire.broadcast_model == expected


def test_a_value_dependent_shape_is_a_user_error_naming_the_tensor():
  import numpy as np
  import tensorflow_federated as tff
  from fedsim.errors import UserError
  from fedsim.sizing.mapreduce_form import type_bits
  value = tff.StructType([("encoded_tensors", tff.StructType([
      ("seed", tff.TensorType(np.int32, [2])),
      ("threshold_k/values", tff.TensorType(np.float32, [None]))]))])
  with pytest.raises(UserError, match="'encoded_tensors/threshold_k/values'"):
    type_bits(value)
