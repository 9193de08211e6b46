"""float16 and bfloat16 against NumPy references of the casts, and their size in the
compiled round: 16 bits per encoded element, nothing else.

The float16 reference is NumPy's own IEEE binary16 cast. NumPy has no bfloat16:
its reference rounds the float32 bit pattern to its top 16 bits, to nearest with
ties to even, in integer arithmetic (no TensorFlow)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from fedsim.compression import parse_direction
from fedsim.errors import UserError
from tests.compression.test_paper_encoders import _round_trip


def _bfloat16_reference(values: np.ndarray) -> np.ndarray:
  """float32 values rounded to bfloat16 (nearest, ties to even), as float32. No NaNs."""
  bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
  lower = bits & 0xFFFF
  upper = bits >> 16
  # Up when the dropped half is above 0x8000, or exactly 0x8000 and the kept part is odd.
  up = (lower > 0x8000) | ((lower == 0x8000) & (upper & 1 == 1))
  rounded = (upper + up) << 16   # a carry into the exponent is right (to inf at the top)
  return rounded.astype(np.uint32).view(np.float32)


def _float16_reference(values: np.ndarray) -> np.ndarray:
  with np.errstate(over="ignore"):   # above 65,504: inf, as intended
    return values.astype(np.float16).astype(np.float32)


REFERENCES = {"float16": _float16_reference, "bfloat16": _bfloat16_reference}


def _values() -> np.ndarray:
  """Normal values over many scales, float16's overflow and subnormals, and the
  bit patterns where rounding decides: ties to even both ways, one below and one
  above a tie, the largest float32 (bfloat16 overflows it to inf)."""
  rng = np.random.default_rng(3)
  scales = 10.0 ** rng.integers(-9, 6, size=4024)
  normal = (rng.normal(size=4024) * scales).astype(np.float32)
  special = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x3F807FFF, 0x3F808001,
                      0x7F7FFFFF, 0x00000001, 0x80000000], np.uint32).view(np.float32)
  extremes = np.array([65504.0, 65520.0, 1e5, -1e6, 6e-8, 3e-8, 1e-40, 0.0], np.float32)
  return np.concatenate([normal, special, extremes]).reshape(40, 101)


def test_bfloat16_reference_rounds_ties_to_even():
  # 1 + 2^-8 lies halfway between bfloat16's 1 and 1 + 2^-7: to the even one, 1;
  # 1 + 3 * 2^-8 lies between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6.
  x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-23, -(1 + 2**-8)], np.float32)
  np.testing.assert_array_equal(_bfloat16_reference(x), [1, 1 + 2**-6, 1 + 2**-7, -1])


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_round_trip_equals_the_numpy_cast_bit_for_bit(name):
  values = _values()
  decoded, encoded = _round_trip(values, {"encoder": name})
  want = REFERENCES[name](values)
  assert decoded.dtype == np.float32
  assert decoded.tobytes() == want.tobytes()   # -0.0, inf and subnormals too
  (sent,) = encoded.values()
  assert sent.shape == values.shape and sent.dtype.itemsize == 2
  assert not np.array_equal(decoded, values)   # it was rounded


def test_float16_overflows_where_bfloat16_keeps_the_range():
  values = np.array([[1e5, -1e6, 3e38]], np.float32)
  half, _ = _round_trip(values, {"encoder": "float16"})
  brain, _ = _round_trip(values, {"encoder": "bfloat16"})
  np.testing.assert_array_equal(half, [[np.inf, -np.inf, np.inf]])
  np.testing.assert_allclose(brain, values, rtol=2**-8)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_fedavg_sends_16_bits_per_parameter_both_ways(name):
  from fedsim.sizing.mapreduce_form import client_wire_bits
  from tests.learning import builders
  model = builders.task_model("mlp", (64,), 10, hidden=[200])
  params = 64 * 200 + 200 + 200 * 10 + 10
  stage = {"name": "encode", "encoder": name, "min_elements": 1}   # every tensor
  algorithm = builders.algorithm("fedavg", {}, model, batch_size=4, aggregation=[stage],
                                 broadcast=[stage])
  wire = client_wire_bits(algorithm.process, algorithm.upload_extras_types)
  assert wire.broadcast_model == wire.aggregate_model == params * 16


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_encoded_mean_and_broadcast_deliver_the_casts(tff_runtime, name):
  import tensorflow_federated as tff
  from fedsim.compression.broadcast import build_encoded_broadcast
  from fedsim.compression.mean import build_encoded_mean
  direction = parse_direction({"encoder": name, "min_elements": 1}, "c.a")
  value_type = tff.to_type([(np.float32, [40, 101])])
  rng = np.random.default_rng(5)
  clients = [[rng.normal(size=[40, 101]).astype(np.float32)] for _ in range(2)]
  mean = build_encoded_mean(direction, weighted=False).create(value_type)
  got = mean.next(mean.initialize(), clients).result[0]
  # The server decodes each client's cast to float32, then averages in float32.
  casts = [REFERENCES[name](c[0]) for c in clients]
  np.testing.assert_allclose(got, (casts[0] + casts[1]) / np.float32(2), rtol=1e-6)

  broadcast = build_encoded_broadcast(value_type, direction)

  @tff.federated_computation(broadcast.initialize.type_signature.result,
                             tff.FederatedType(value_type, tff.SERVER),
                             tff.FederatedType(np.float32, tff.CLIENTS))
  def deliver(state, value, marker):
    return tff.federated_zip((broadcast.next(state, value).result, marker))

  for received, _ in deliver(broadcast.initialize(), clients[0], [0.0, 1.0]):
    np.testing.assert_array_equal(received[0], casts[0])


def test_casts_take_no_parameters():
  with pytest.raises(UserError, match=r"^c\.a\.bits: unknown key for encoder 'float16'"):
    parse_direction({"encoder": "float16", "bits": 8}, "c.a")
