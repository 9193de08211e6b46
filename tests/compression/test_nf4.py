"""nf4 against a NumPy reference of QLoRA's blockwise NormalFloat quantizer
(Dettmers et al. 2023) and against the 16 levels bitsandbytes publishes; its
size in the compiled round from the packing by hand; a run from a config."""

from __future__ import annotations

import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from fedsim.compression import parse_direction
from fedsim.compression.stages.normal_float import nf4_levels
from fedsim.errors import UserError
from tests.compression.test_encoders import _reimported_shapes
from tests.compression.test_paper_encoders import _round_trip

# The NF4 levels of the QLoRA paper (appendix E) as bitsandbytes ships them
# (csrc/kernels.cu, dDequantizeNF4): float32 values computed from N(0, 1) quantiles.
PUBLISHED = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
             -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
             0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
             0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
             0.7229568362236023, 1.0]


def _reference_levels() -> np.ndarray:
  """NF4 by the paper's construction: quantiles of N(0, 1) at probabilities
  equally spaced from an offset to 1/2, 8 on the positive side and 7 on the
  negative side, one zero, divided by the largest (SciPy's quantile function).
  The offset is the mean of the outermost probabilities 1 - 1/(2 * 15) and
  1 - 1/(2 * 16) of 15 and 16 equal-mass bins: 0.9677083 to the 7 digits of
  bitsandbytes' `create_normal_map` default (its rounding moves the levels by
  ~3e-8, enough to change float32 roundings)."""
  from scipy.stats import norm
  offset = (1 - 1 / 30 + 1 - 1 / 32) / 2
  assert round(offset, 7) == 0.9677083
  positive = norm.ppf(np.linspace(offset, 0.5, 9)[:-1])
  negative = -norm.ppf(np.linspace(offset, 0.5, 8)[:-1])
  levels = np.sort(np.concatenate([negative, [0.0], positive]))
  return levels / levels.max()


def _reference_quantizer(values: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
  """(decoded, absmax per block) of QLoRA's blockwise quantization of `values`
  flattened: each block divided by its absmax, each element to the nearest level."""
  levels = _reference_levels().astype(np.float32)
  flat = values.reshape(-1).astype(np.float32)
  decoded, absmaxes = np.empty_like(flat), []
  for start in range(0, flat.size, block):
    chunk = flat[start:start + block]
    absmax = np.abs(chunk).max()
    normalized = chunk / absmax if absmax > 0 else np.zeros_like(chunk)
    nearest = np.argmin(np.abs(normalized[:, None].astype(np.float64) - levels[None, :]), axis=1)
    decoded[start:start + block] = levels[nearest] * absmax
    absmaxes.append(absmax)
  return decoded.reshape(values.shape), np.array(absmaxes, np.float32)


def test_levels_are_the_papers_normal_quantiles_and_the_published_ones():
  levels = np.array(nf4_levels())
  np.testing.assert_allclose(_reference_levels(), PUBLISHED, rtol=0, atol=1e-6)
  np.testing.assert_allclose(levels, PUBLISHED, rtol=0, atol=1e-6)
  np.testing.assert_allclose(levels, _reference_levels(), rtol=0, atol=1e-12)
  assert levels[0] == -1 and levels[-1] == 1 and levels[7] == 0
  assert (levels > 0).sum() == 8 and (levels < 0).sum() == 7


def _tensors() -> list[np.ndarray]:
  rng = np.random.default_rng(21)
  normal = rng.normal(size=[50, 40]).astype(np.float32)
  normal[0, :40] = 0.0   # a whole zero block at block size 40 and below
  heavy = rng.standard_t(2, size=[1001]).astype(np.float32)
  return [normal, heavy]


@pytest.mark.parametrize("block", [64, 40, 1, 4096])
def test_round_trip_equals_the_numpy_quantizer_exactly(block):
  for values in _tensors():
    decoded, encoded = _round_trip(values, {"encoder": "nf4", "block_size": block})
    want, absmax = _reference_quantizer(values, block)
    assert decoded.tobytes() == want.tobytes()
    assert encoded["absmax"].tobytes() == absmax.tobytes()
    # n 4-bit indices, 7 to an int32 (no padding to whole blocks is sent).
    assert encoded["bitpacked_values"].shape == (math.ceil(values.size * 4 / 28), 1)
    assert encoded["absmax"].shape == (math.ceil(values.size / block),)


def test_every_level_is_used_and_blocks_are_scaled_apart():
  values = np.random.default_rng(2).normal(size=[4096]).astype(np.float32)
  values[:64] *= 1000   # one loud block does not drown the others
  decoded, encoded = _round_trip(values, {"encoder": "nf4"})
  absmax = encoded["absmax"]
  normalized = decoded.reshape(-1, 64) / absmax[:, None]
  used = np.unique(np.round(normalized, 6))
  np.testing.assert_allclose(used, np.array(PUBLISHED), atol=1e-6)
  quiet = values[64:]
  assert np.abs(decoded[64:] - quiet).max() < 0.2 * np.abs(quiet).max()


# 2000 / 64 leaves a partial block already; `-m long` sizes a block of 48 too.
@pytest.mark.parametrize("block", [64, pytest.param(48, marks=pytest.mark.long)])
def test_fedavg_sizes_nf4_to_its_packed_indices_and_absmax(block):
  from fedsim.sizing.mapreduce_form import client_wire_bits
  from tests.learning import builders
  model = builders.task_model("mlp", (64,), 10, hidden=[200])   # kernels 12800 and 2000
  stage = {"name": "encode", "encoder": "nf4", "block_size": block, "min_elements": 2000}
  algorithm = builders.algorithm("fedavg", {}, model, batch_size=4, aggregation=[stage],
                                 broadcast=[stage])
  wire = client_wire_bits(algorithm.process, algorithm.upload_extras_types)
  # Per kernel: n indices of 4 bits packed 28 to an int32 (bit packing's unit:
  # 28 of 32 bits, an overhead of 8/7), and one float32 absmax per block. The
  # biases (200 + 10) go as float32.
  expected = sum(math.ceil(n * 4 / 28) * 32 + math.ceil(n / block) * 32 for n in (12800, 2000))
  assert wire.aggregate_model == wire.broadcast_model == expected + 210 * 32


def test_encoded_mean_averages_the_quantized_clients(tff_runtime):
  import tensorflow_federated as tff
  from fedsim.compression.mean import build_encoded_mean
  direction = parse_direction({"encoder": "nf4", "block_size": 32, "min_elements": 1}, "c.a")
  process = build_encoded_mean(direction, weighted=False).create(
      tff.TensorType(np.float32, [30, 33]))
  rng = np.random.default_rng(9)
  clients = [rng.normal(size=[30, 33]).astype(np.float32) * s for s in (1.0, 0.01)]
  got = process.next(process.initialize(), clients).result
  decoded = [_reference_quantizer(c, 32)[0] for c in clients]
  np.testing.assert_allclose(got, (decoded[0] + decoded[1]) / 2, rtol=1e-6, atol=1e-9)


def test_encoded_shapes_stay_static_in_a_reimported_graph():
  direction = parse_direction({"encoder": "nf4", "min_elements": 1}, "c.a")
  sizes = [3, 100, 2049, 10003]
  for size, shapes in zip(sizes, _reimported_shapes(direction, sizes)):
    assert all(None not in shape for shape in shapes.values()), (size, shapes)
    assert shapes["decoded"] == (size,)


@pytest.mark.slow
def test_a_config_broadcasts_bfloat16_and_uploads_nf4(tff_runtime, tmp_path):
  import fedsim
  config = {
      "name": "nf4", "seed": 1, "rounds": 1, "clients_per_round": 2,
      "data": {"name": "digits", "num_clients": 4, "partition": "iid", "batch_size": 16},
      "model": {"name": "logistic"},   # a 64 x 10 kernel and 10 biases
      "algorithm": {"name": "fedavg"},
      "broadcast": [{"name": "encode", "encoder": "bfloat16", "min_elements": 1}],
      "aggregation": [{"name": "encode", "encoder": "nf4", "block_size": 64,
                       "min_elements": 1}],
  }
  (row,) = fedsim.run(config, logdir=tmp_path).metrics
  assert row["broadcast_model_bits_per_client"] == 650 * 16
  assert row["aggregate_model_bits_per_client"] == sum(
      math.ceil(n * 4 / 28) * 32 + math.ceil(n / 64) * 32 for n in (640, 10))
  assert math.isfinite(row["train/loss"])


def test_block_size_errors_name_the_key():
  with pytest.raises(UserError, match=r"^aggregation\[0\]\.block_size: must be >= 1, got 0"):
    parse_direction({"encoder": "nf4", "block_size": 0}, "aggregation[0]")
