"""The `ddp` and `local_dp` stages: what they compute on toy clients, what they
send (sized from the compiled round), and the configs they refuse."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsim.aggregation import UNWEIGHTED_MEAN, WEIGHTED_MEAN, check_chain, parse_aggregation
from fedsim.errors import UserError

MLP_PARAMS = 64 * 64 + 64 + 64 * 10 + 10   # 4,810 weights: even, so dft pads nothing


def _wire(chain):
  from fedsim.sizing.mapreduce_form import client_wire_bits
  from tests.learning import builders
  model = builders.task_model("mlp", (64,), 10, hidden=[64])
  assert model.num_params == MLP_PARAMS
  algorithm = builders.algorithm("fedavg", {"client_weighting": "uniform"}, model,
                                 batch_size=4, aggregation=chain, clients_per_round=10)
  return client_wire_bits(algorithm.process, algorithm.upload_extras_types)


def test_a_secure_sum_is_sized_by_its_bitwidth_not_its_dtype():
  """ddp sends each of the 4,810 coordinates as a `bits`-bit integer (held in
  an int32), so each extra bit costs 4,810 bits; `secure` quantizes floats to
  TFF's 32 bits (held in an int64)."""
  ddp = {"name": "ddp", "noise_multiplier": 1.0, "clip": 1.0}
  sizes = {bits: _wire([dict(ddp, bits=bits)]).aggregate_model for bits in (8, 12)}
  assert sizes[12] - sizes[8] == 4 * MLP_PARAMS
  assert 0 <= sizes[8] - 8 * MLP_PARAMS < 64       # the 1-bit secure counts
  secure = _wire([{"name": "secure", "upper": 1.0}]).aggregate_model
  assert 0 <= secure - 32 * MLP_PARAMS < 64


def _clients(rng, count, dim, norms):
  values = rng.normal(size=(count, dim)).astype(np.float32)
  scaled = values / np.linalg.norm(values, axis=1, keepdims=True) * np.asarray(norms)[:, None]
  return scaled.astype(np.float32)


def _clipped_mean(values, clip):
  norms = np.linalg.norm(values, axis=1, keepdims=True)
  return np.mean(values * np.minimum(1.0, clip / norms), axis=0)


def test_ddp_without_noise_is_the_mean_of_clipped_updates(tff_runtime):
  import tensorflow_federated as tff
  from fedsim.aggregation.ddp import DdpParams, build_ddp
  from fedsim.aggregation import StageContext
  from fedsim.backend.distributed_dp import ddp_bounds
  dim, clip = 50, 1.0
  values = _clients(np.random.default_rng(0), 3, dim, [0.5, 2.0, 4.0])
  factory = build_ddp(DdpParams(noise_multiplier=0.0, clip=clip, bits=16),
                      StageContext(UNWEIGHTED_MEAN, 3, 0, 0))
  process = factory.create(tff.TensorType(np.float32, [dim]))
  out = process.next(process.initialize(), list(values))
  # Rounding to a 1/scale grid (scale ~ 1e4 here) is the only error.
  np.testing.assert_allclose(out.result, _clipped_mean(values, clip), atol=1e-3)
  measured = out.measurements["mean_value"]
  bounds = ddp_bounds(0.0, 3, 16, clip, dim, "dft", 0.0, 1e-4)
  assert measured["padded_dim"] == bounds.padded_dim == dim
  assert measured["scale_factor"] == pytest.approx(bounds.scale, rel=1e-6)
  assert measured["scaled_inflated_l2"] == pytest.approx(bounds.l2_bound, rel=1e-6)


def test_local_dp_clips_then_each_client_adds_its_own_noise(tff_runtime):
  """Mean of 3 clients' clipped updates plus noise of stddev z C / sqrt(3):
  independent per client (identical draws would give z C), seeded (a rerun
  repeats it) and fresh each round."""
  import tensorflow_federated as tff
  from fedsim.aggregation import StageContext
  from fedsim.aggregation.local_dp import LocalDpParams, build_local_dp
  dim, clip, z = 20000, 0.5, 2.0
  values = _clients(np.random.default_rng(1), 3, dim, [0.1, 1.0, 3.0])
  factory = build_local_dp(LocalDpParams(noise_multiplier=z, clip=clip),
                           tff.aggregators.UnweightedMeanFactory(),
                           StageContext(UNWEIGHTED_MEAN, 3, 7, 0))
  process = factory.create(tff.TensorType(np.float32, [dim]))
  state = process.initialize()
  first = process.next(state, list(values))
  again = process.next(state, list(values))
  second = process.next(first.state, list(values))
  noise = first.result - _clipped_mean(values, clip)
  assert np.std(noise) == pytest.approx(z * clip / math.sqrt(3), rel=0.03)
  assert abs(np.mean(noise)) < 0.03
  np.testing.assert_array_equal(first.result, again.result)
  assert np.corrcoef(noise, second.result - _clipped_mean(values, clip))[0, 1] < 0.05
  assert first.measurements["clipped_count"] == 2


@pytest.mark.parametrize("stage", [{"name": "ddp", "noise_multiplier": 1.0, "clip": 1.0},
                                   {"name": "local_dp", "noise_multiplier": 1.0, "clip": 1.0}])
def test_example_weighting_is_refused_in_one_line(stage):
  with pytest.raises(UserError, match=rf"^aggregation\[0\] {stage['name']}: differentially"
                                      r" private aggregation is unweighted.*client_weighting"):
    check_chain(parse_aggregation([stage]), WEIGHTED_MEAN, "fedavg", 10)


def test_ddp_bits_too_few_for_the_clients_are_refused():
  chain = parse_aggregation([{"name": "ddp", "noise_multiplier": 1.0, "clip": 1.0, "bits": 6}])
  with pytest.raises(UserError, match=r"^aggregation\[0\]\.bits: 6 bits cannot hold the sum"
                                      r" of 100 clients .* use at least 7$"):
    check_chain(chain, UNWEIGHTED_MEAN, "fedavg", 100)
  check_chain(chain, UNWEIGHTED_MEAN, "fedavg", 10)   # 2^12 >= 10 x 3.9^2


@pytest.mark.slow
def test_a_config_runs_ddp_on_local_and_sends_its_bits(tff_runtime, tmp_path):
  """ddp's secure sums run on `local` (auto falls back); the round uploads
  650 x 10 bits of the logistic model's update (dft pads 650 to 650)."""
  import fedsim
  config = {
      "name": "ddp", "seed": 1, "rounds": 2, "clients_per_round": 3,
      "data": {"name": "digits", "num_clients": 8, "partition": "iid", "batch_size": 16},
      "model": {"name": "logistic"},
      "algorithm": {"name": "fedavg", "client_weighting": "uniform"},
      "aggregation": [{"name": "ddp", "noise_multiplier": 0.5, "clip": 1.0, "bits": 10}],
  }
  rows = fedsim.run(config, logdir=tmp_path).metrics
  assert [r["aggregation/ddp/mean_value/actual_num_clients"] for r in rows] == [3, 3]
  assert [r["aggregation/ddp/mean_value/padded_dim"] for r in rows] == [650, 650]
  assert 0 <= rows[0]["aggregate_model_bits_per_client"] - 650 * 10 < 64
  # The run logs the ddp ledger's epsilon, growing with the rounds that aggregated.
  epsilons = [r["privacy/epsilon"] for r in rows]
  assert 0 < epsilons[0] < epsilons[1] < float("inf")
