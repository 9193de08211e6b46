"""DP-FedAvg built from the chain: plain FedAvg when no noise and no clipping
happen, seeded noise that both runtimes draw alike, exact sizes, and epsilon."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.sizing.mapreduce_form import client_wire_bits
from tests.learning import builders

PARAMS = {"client_optimizer": {"name": "sgd", "learning_rate": 0.4},
          "client_weighting": "uniform"}


def _clients(seed, count=3, steps=2, batch=2, dim=3, classes=2):
  rng = np.random.default_rng(seed)
  return [{"x": rng.normal(size=(steps, batch, dim)).astype(np.float32),
           "y": rng.integers(0, classes, (steps, batch)).astype(np.int32),
           "mask": np.ones((steps, batch), np.float32)} for _ in range(count)]


def _final_weights(process, rounds=2):
  state = process.initialize()
  for r in range(rounds):
    state, _ = process.next(state, _clients(r))
  return [np.asarray(w) for w in state.global_model_weights.trainable]


def _dp(noise_multiplier, clip, seed=0, **extra):
  return builders.algorithm(
      "fedavg", PARAMS, builders.task_model(), clients_per_round=3, seed=seed,
      aggregation=[{"name": "dp_gaussian", "noise_multiplier": noise_multiplier,
                    "clip": clip, **extra}])


def test_without_noise_and_with_an_unreached_clip_it_is_plain_fedavg(tff_runtime):
  plain = builders.algorithm("fedavg", PARAMS, builders.task_model())
  for want, got in zip(_final_weights(plain.process), _final_weights(_dp(0.0, 1e6).process)):
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_noise_repeats_for_a_seed_and_differs_across_seeds(tff_runtime):
  first = _final_weights(_dp(1.0, 0.5, seed=3).process)
  again = _final_weights(_dp(1.0, 0.5, seed=3).process)
  other = _final_weights(_dp(1.0, 0.5, seed=4).process)
  for a, b, c in zip(first, again, other):
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("extra", [{}, {"adaptive": True, "clipped_count_stddev": 1.0}])
def test_inprocess_draws_the_same_noise_as_the_tff_runtime(tff_runtime, extra):
  from fedsim.runtime import inprocess
  alg = _dp(1.0, 0.5, seed=2, **extra)
  local = _final_weights(alg.process)
  here = _final_weights(inprocess.InProcessProcess(alg.process, "cpu"))
  for want, got in zip(local, here):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_differential_privacy_adds_no_bits_to_the_model_update():
  model = builders.task_model(input_shape=(10,), num_classes=3)  # 33 parameters
  dp = builders.algorithm("fedavg", PARAMS, model, clients_per_round=3,
                          aggregation=[{"name": "dp_gaussian", "noise_multiplier": 1.0,
                                        "clip": 1.0}])
  bits = client_wire_bits(dp.process, dp.upload_extras_types)
  assert bits.aggregate_model == 33 * 32  # the clipped update; the noise is the server's
  assert bits.broadcast == 33 * 32 + 32   # the model, and the clip the clients apply


def test_epsilon_is_the_rdp_composition_of_sampled_gaussian_rounds():
  # Replace-one moves the clipped sum by 2 clips: multiplier 1.1 is 0.55 of that
  # sensitivity (that it bounds the true loss: test_dp_worst_case.py).
  import dp_accounting
  from fedsim.aggregation.accounting import PrivacyLedger
  ledger = PrivacyLedger(noise_multiplier=1.1, population=500, sample_size=20, delta=1e-5)
  for rounds in (1, 7, 40):
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
        500, 20, dp_accounting.GaussianDpEvent(0.55)), rounds)
    accountant = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    assert ledger.epsilon(rounds) == pytest.approx(
        accountant.compose(event).get_epsilon(1e-5), rel=1e-9)
  assert ledger.epsilon(0) == 0.0
  assert PrivacyLedger(0.0, 500, 20, 1e-5).epsilon(3) == float("inf")
  assert ledger.epsilon(40) > ledger.epsilon(7) > ledger.epsilon(1) > 0


@pytest.mark.parametrize("weighting,chain", [
    ("num_examples", [{"name": "zeroing", "max_norm": 50.0},
                      {"name": "clip", "norm": 0.3, "adaptive": True},
                      {"name": "encode", "encoder": "uniform", "bits": 8, "min_elements": 1,
                       "rounding": "deterministic"}]),
    ("num_examples", ["robust"]),
    ("uniform", [{"name": "clip", "norm": 0.3}, {"name": "mean"},
                 {"name": "zeroing", "max_norm": 0.05}]),
])
def test_inprocess_runs_every_chain_as_the_tff_runtime_does(tff_runtime, weighting, chain):
  from fedsim.runtime import inprocess
  alg = builders.algorithm("fedavg", dict(PARAMS, client_weighting=weighting),
                           builders.task_model(), clients_per_round=3, aggregation=chain)
  local = _final_weights(alg.process)
  here = _final_weights(inprocess.InProcessProcess(alg.process, "cpu"))
  for want, got in zip(local, here):
    np.testing.assert_allclose(got, want, atol=1e-5)
