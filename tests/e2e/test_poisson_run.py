"""`sampling: poisson` through the whole run loop: each round aggregates every
client its Poisson draw sampled (rounds vary in size), a round nobody was
drawn for is skipped and spends no privacy, and epsilon is the Poisson ledger's."""

from __future__ import annotations

import pytest

import fedsim
from fedsim.aggregation.accounting import PrivacyLedger
from fedsim.data.sampling import ClientSampler

RATE, SEED, CLIENTS = 0.08, 1, 20
CONFIG = {
    "name": "poisson", "seed": SEED, "rounds": 8, "clients_per_round": 2,
    "sampling": "poisson", "sampling_rate": RATE,
    "data": {"name": "digits", "num_clients": CLIENTS, "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg", "client_weighting": "uniform"},
    "aggregation": [{"name": "dp_gaussian", "noise_multiplier": 1.0, "clip": 0.5}],
    "runtime": {"name": "inprocess"}, "eval": {"every": 4},
}


@pytest.mark.slow
def test_poisson_rounds_vary_in_size_and_empty_ones_spend_nothing(tmp_path):
  seen = []
  result = fedsim.run(CONFIG, logdir=tmp_path, progress=False,
                      on_round=lambda r, metrics, info: seen.append((metrics, info)))
  draws = [len(info.sampled) for _, info in seen]
  # Seed 1 draws 0, 3, 2, 3, 0, 2, 2, 0 of the 20 clients in rounds 1-8.
  assert draws == [0, 3, 2, 3, 0, 2, 2, 0]
  released = 0
  for metrics, info in seen:
    assert info.aggregated == info.sampled or (not info.sampled and info.aggregated == ())
    assert metrics["clients/aggregated"] == len(info.sampled)
    released += bool(info.sampled)
    assert metrics["privacy/epsilon"] == pytest.approx(
        PrivacyLedger(1.0, CLIENTS, 2, 1e-5, poisson_rate=RATE).epsilon(released))
  assert [m["round_skipped"] for m, _ in seen] == [int(n == 0) for n in draws]


def test_the_draws_above_are_the_sampler_s():
  sampler = ClientSampler(tuple(f"c{i}" for i in range(CLIENTS)), SEED, poisson_rate=RATE)
  assert [len(sampler.sample(r, 2)) for r in range(1, 9)] == [0, 3, 2, 3, 0, 2, 2, 0]
