"""Bits measured inside the round: the server's accumulate meters each client's
encoded upload (entropy-coded symbols, value-dependent sizes) without sending
anything more, and the server meters the broadcast it encodes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsim.compression import parse_direction
from fedsim.sizing import varying
from fedsim.sizing.entropy import entropy_bits, raw_bits

N, SEED = 3000, 7


@pytest.fixture(scope="module", autouse=True)
def _runtime(tff_runtime):
  yield tff_runtime


def _direction(encoder, **params):
  return parse_direction({"encoder": encoder, "min_elements": 100, **params}, "aggregation[0]")


def _symbols(direction, value, index=0):
  """The packed symbols of `value` (NumPy), re-encoded without packing under the same noise."""
  import tensorflow as tf
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.bit_packing import packed_symbols
  from fedsim.compression.encoders import encoder_for
  spec = tf.TensorSpec(value.shape, tf.float32)
  with te_api.noise_key(SEED, index):
    encoder = encoder_for(spec, direction)
  with te_api.noise_round(0):   # a sum's first round
    packed = packed_symbols(encoder, tf.constant(value))
  return [(np.round(s.numpy()).astype(np.int64), b) for s, b in packed]


@pytest.mark.parametrize("alphabet,n", [(2, 1000), (16, 5000), (256, 20000), (4, 1), (8, 64)])
def test_tensorflow_entropy_equals_numpy(alphabet, n):
  import tensorflow as tf
  from fedsim.compression.wire_meter import entropy_bits as tf_entropy_bits
  rng = np.random.default_rng(n)
  for symbols in (rng.integers(0, alphabet, n),
                  np.clip(np.round(rng.normal(alphabet / 2, alphabet / 8, n)), 0, alphabet - 1),
                  np.arange(n) % alphabet):   # equal counts: n * H is an exact integer
    symbols = symbols.astype(np.int64)
    got = int(tf_entropy_bits(tf.constant(symbols, tf.int32), alphabet))
    assert got == entropy_bits(symbols, alphabet)
    assert got <= raw_bits(n, alphabet)


@pytest.mark.parametrize("encoder,params", [("uniform", {"bits": 4}), ("qsgd", {}),
                                            ("sign", {}), ("topk", {"fraction": 0.1})])
def test_accumulate_meters_each_client_upload(encoder, params):
  import tensorflow_federated as tff
  from fedsim.compression.mean import build_encoded_sum
  direction = _direction(encoder, **params)
  value_type = tff.to_type([(np.float32, [N]), (np.float32, [10])])
  process = build_encoded_sum(direction, SEED).create(value_type)
  rng = np.random.default_rng(1)
  clients = [[rng.normal(size=N).astype(np.float32), rng.normal(size=10).astype(np.float32)]
             for _ in range(3)]
  wire = process.next(process.initialize(), clients).measurements["wire"]
  expected_entropy = expected_packed = 0
  for value in clients:
    for symbols, bits in _symbols(direction, value[0]):
      expected_entropy += entropy_bits(symbols, 2**bits)
      expected_packed += math.ceil(symbols.size * bits / 28) * 32
  assert wire["entropy_bits"] == expected_entropy
  assert wire["packed_bits"] == expected_packed
  assert wire["entropy_bits"] <= wire["packed_bits"]
  assert wire["variable_bits"] == 0
  if encoder == "topk":   # floats and indices: nothing is entropy-coded
    assert expected_packed == 0
  else:
    assert 0 < wire["entropy_bits"]


def test_size_info_folds_in_measured_wire_bits():
  from fedsim.sizing import ClientWireBits, SizeInfo
  info = SizeInfo(per_client=ClientWireBits(broadcast=1000, broadcast_model=900,
                                            aggregate=500, aggregate_model=400))
  measured = {"distributor/wire/packed_bits": 320, "distributor/wire/entropy_bits": 200,
              "distributor/wire/variable_bits": 0, "distributor/wire/packed_symbols": 280,
              # two aggregated clients, summed; one more upload arrived late
              "aggregation/mean/x": 5.0, "aggregation/encode/wire/packed_bits": 640,
              "aggregation/encode/wire/entropy_bits": 500,
              "aggregation/encode/wire/variable_bits": 96,
              "aggregation/encode/wire/packed_symbols": 560}
  row = info.round_metrics(broadcast_clients=3, aggregated_clients=2, late_uploads=1,
                           measured=measured)
  assert row["broadcast_bits"] == 3000
  assert row["broadcast_entropy_bits"] == 3 * (1000 - 320 + 200)
  # 3 uploads at the static 500 bits, plus 48 measured bits each (the late one
  # at the aggregated clients' mean).
  assert row["aggregate_bits"] == 3 * 500 + 3 * 48
  assert row["late_upload_bits"] == 548
  assert row["aggregate_entropy_bits"] == row["aggregate_bits"] - 3 * 70
  # Per client: the fixed 500 bits, and what the two aggregated clients measured.
  assert row["aggregate_bits_per_client"] == 500
  assert row["aggregate_bits_per_client_mean"] == 548
  assert row["broadcast_bits_per_client_mean"] == row["broadcast_bits_per_client_max"] == 1000
  # A round that broadcast bits but measured no packed symbols leaves the
  # broadcast estimate blank (it would only repeat the raw bits), and its total.
  second = info.round_metrics(broadcast_clients=1, aggregated_clients=0)
  assert second["aggregate_entropy_bits"] == second["aggregate_bits"] == 0
  assert "broadcast_entropy_bits" not in second
  assert "cumulative_broadcast_entropy_bits" not in second
  assert "aggregate_bits_per_client_mean" not in second
  assert second["cumulative_aggregate_entropy_bits"] == row["aggregate_entropy_bits"]


def test_size_info_counts_the_lossless_code_and_each_clients_measured_bits():
  from fedsim.sizing import ClientWireBits, SizeInfo, varying
  info = SizeInfo(per_client=ClientWireBits(broadcast=1000, broadcast_model=900,
                                            aggregate=500, aggregate_model=400))
  # Two clients, 320 packed bits each in the static 500: their codes took 100
  # and 180 bits, the larger one's measured part (variable + coded) 180 + 64.
  measured = {"aggregation/encode/wire/packed_bits": 640,
              "aggregation/encode/wire/coded_bits": 280,
              "aggregation/encode/wire/entropy_bits": 250,
              "aggregation/encode/wire/variable_bits": 64,
              "aggregation/encode/wire/packed_symbols": 2000,
              "aggregation/encode/wire/max_client_bits": 244}
  row = info.round_metrics(broadcast_clients=2, aggregated_clients=2, measured=measured)
  client_bits = [500 - 320 + 100 + 0, 500 - 320 + 180 + 64]   # 280 and 424
  assert row["aggregate_bits"] == sum(client_bits)
  assert row["aggregate_bits_per_client_mean"] == sum(client_bits) / 2
  assert row["aggregate_bits_per_client_max"] == max(client_bits)
  assert row["aggregate_entropy_bits"] == 2 * 500 - 640 + 250 + 64
  assert "broadcast_entropy_bits" not in row   # nothing packed down: not measured
  assert varying([measured], "aggregation") and not varying([measured], "distributor")


PACKED = math.ceil(640 * 4 / 28) * 32   # the 64 x 10 kernel; the bias goes unencoded


def _run_uniform4_both_ways(tmp_path, runtime, **stage_keys):
  """A 2-round run of 3 clients with 4-bit uniform both ways: (its result, and
  the NumPy bits of round 2's broadcast symbols, re-encoded from the model round
  1 left under the run's seed and round index 1)."""
  import fedsim
  from fedsim.sizing.encoded_entropy import encoded_entropy_bits
  stage = {"name": "encode", "encoder": "uniform", "bits": 4, "min_elements": 100, **stage_keys}
  config = {
      "name": "entropy", "seed": 3, "rounds": 2, "clients_per_round": 3,
      "data": {"name": "digits", "num_clients": 6, "partition": "iid", "batch_size": 16},
      "model": {"name": "logistic"}, "algorithm": {"name": "fedavg"},
      "aggregation": [stage], "broadcast": [stage], "runtime": {"name": runtime}}
  weights = []
  result = fedsim.run(config, logdir=tmp_path,
                      on_round=lambda r, m, info: weights.append(info.weights))
  direction = parse_direction({k: v for k, v in stage.items() if k != "name"}, "b")
  return result, encoded_entropy_bits(weights[0], direction, seed=3, round_index=1)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["local", "inprocess"])
def test_a_run_logs_entropy_bits_both_ways(tmp_path, runtime):
  result, symbols = _run_uniform4_both_ways(tmp_path, runtime)
  per, packed = result.size_info.per_client, PACKED
  row = result.metrics[1]
  assert row["broadcast_entropy_bits"] == 3 * (per.broadcast - packed + symbols.entropy)
  for row in result.metrics:
    assert row["aggregate_bits"] == 3 * per.aggregate   # static sizes, unchanged
    assert row["aggregation/encode/wire/packed_bits"] == 3 * packed
    assert row["aggregate_entropy_bits"] == (row["aggregate_bits"] - 3 * packed
                                             + row["aggregation/encode/wire/entropy_bits"])
    assert row["aggregate_entropy_bits"] <= row["aggregate_bits"]
    assert row["broadcast_entropy_bits"] <= row["broadcast_bits"]
  assert not varying(result.metrics, "aggregation")
  assert result.metrics[-1]["cumulative_aggregate_entropy_bits"] == sum(
      r["aggregate_entropy_bits"] for r in result.metrics)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["local", "inprocess"])
def test_a_lossless_run_logs_its_huffman_code_on_every_runtime(tmp_path, runtime):
  result, symbols = _run_uniform4_both_ways(tmp_path, runtime, lossless="huffman")
  per, packed = result.size_info.per_client, PACKED
  # Round 2's broadcast: the code NumPy writes for its symbols.
  row = result.metrics[1]
  assert row["broadcast_bits"] == 3 * (per.broadcast - packed + symbols.huffman)
  assert row["broadcast_bits_per_client_mean"] == per.broadcast - packed + symbols.huffman
  assert row["broadcast_entropy_bits"] == 3 * (per.broadcast - packed + symbols.entropy)
  for row in result.metrics:
    coded = row["aggregation/encode/wire/coded_bits"]
    assert 0 < coded < row["aggregation/encode/wire/packed_bits"] == 3 * packed
    assert row["aggregate_bits"] == 3 * per.aggregate - 3 * packed + coded
    assert (row["aggregate_bits_per_client_max"] >= row["aggregate_bits_per_client_mean"]
            == row["aggregate_bits"] / 3)
  assert varying(result.metrics, "aggregation") and varying(result.metrics, "distributor")


def test_threshold_bits_are_measured_per_client_and_vary():
  import tensorflow_federated as tff
  from fedsim.compression.mean import build_encoded_sum
  tau = 1.5
  direction = _direction("threshold", tau=tau)
  process = build_encoded_sum(direction, SEED).create(tff.TensorType(np.float32, [N]))
  rng = np.random.default_rng(2)
  dense = rng.normal(size=N).astype(np.float32)           # ~13% above 1.5
  sparse = (rng.normal(size=N) * 0.5).astype(np.float32)  # ~0.3% above 1.5
  state = process.initialize()
  per_client = [int(process.next(state, [x]).measurements["wire"]["variable_bits"])
                for x in (dense, sparse)]
  # Each kept coordinate: its float32 value and its int32 index, as sent.
  assert per_client == [int((np.abs(x) >= tau).sum()) * (32 + 32) for x in (dense, sparse)]
  assert per_client[0] > 10 * per_client[1] > 0
  both = process.next(state, [dense, sparse])
  assert both.measurements["wire"]["variable_bits"] == sum(per_client)
  assert both.measurements["wire"]["max_client_bits"] == max(per_client)
  expected = sum(np.where(np.abs(x) >= tau, x, 0) for x in (dense, sparse))
  np.testing.assert_array_equal(both.result, expected)


def test_static_sizing_counts_the_fixed_part_of_a_threshold_upload():
  from fedsim.errors import UserError
  from fedsim.sizing.mapreduce_form import client_wire_bits
  from tests.learning import builders
  model = builders.task_model("mlp", (64,), 10, hidden=[200])   # kernels 12800 and 2000
  stage = {"name": "encode", "encoder": "threshold", "tau": 0.01, "min_elements": 10000}
  alg = builders.algorithm("fedavg", {}, model, batch_size=4, aggregation=[stage],
                           broadcast=[stage])
  with pytest.raises(UserError, match="report its own bits"):
    client_wire_bits(alg.process, alg.upload_extras_types)
  wire = client_wire_bits(alg.process, alg.upload_extras_types, measured=True)
  # The 12800-weight kernel is all measured; the rest goes as float32.
  assert wire.broadcast_model == wire.aggregate_model == (200 + 2000 + 10) * 32


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["local", "inprocess"])
def test_a_threshold_run_counts_measured_bits_each_round(tmp_path, runtime):
  import fedsim
  config = {
      "name": "threshold", "seed": 3, "rounds": 2, "clients_per_round": 3,
      "data": {"name": "digits", "num_clients": 6, "partition": "iid", "batch_size": 16},
      "model": {"name": "logistic"}, "algorithm": {"name": "fedavg"},
      "aggregation": [{"name": "encode", "encoder": "threshold", "tau": 0.02,
                       "min_elements": 100}],
      "broadcast": [{"name": "encode", "encoder": "threshold", "tau": 0.05,
                     "min_elements": 100}],
      "runtime": {"name": runtime}}
  result = fedsim.run(config, logdir=tmp_path)
  per = result.size_info.per_client
  # Static sizing holds the fixed part: the 10 biases both ways (plus the
  # learning rate down, the weight and metrics up); the kernel is measured.
  assert per.broadcast_model == 10 * 32
  uploads = []
  for row in result.metrics:
    down, up = row["distributor/wire/variable_bits"], row["aggregation/encode/wire/variable_bits"]
    assert 0 < down < 640 * 64 and 0 < up < 3 * 640 * 64
    assert down % 64 == 0 and up % 64 == 0   # a float32 value and an int32 index each
    assert row["broadcast_bits"] == 3 * (per.broadcast + down)
    assert row["aggregate_bits"] == 3 * per.aggregate + up
    # Per client: the fixed part, and the measured mean and largest next to it.
    assert row["aggregate_bits_per_client"] == per.aggregate
    assert row["aggregate_bits_per_client_mean"] == per.aggregate + up / 3
    largest = row["aggregation/encode/wire/max_client_bits"]
    assert up / 3 <= largest <= up and largest % 64 == 0
    assert row["aggregate_bits_per_client_max"] == per.aggregate + largest
    # Nothing packed, so no entropy estimate that would only repeat these bits.
    assert "aggregate_entropy_bits" not in row and "broadcast_entropy_bits" not in row
    uploads.append(up)
  assert uploads[0] != uploads[1]
  assert varying(result.metrics, "aggregation") and varying(result.metrics, "distributor")
  assert result.size_info.aggregate_history == [r["aggregate_bits"] for r in result.metrics]
