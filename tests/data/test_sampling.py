"""ClientSampler: a pure function of (seed, round)."""

from __future__ import annotations

import collections

import pytest

from fedsim.data.federated import client_ids
from fedsim.data.sampling import ClientSampler
from fedsim.errors import UserError

IDS = tuple(client_ids(20))


def test_same_seed_and_round_give_the_same_cohort_across_instances():
  assert ClientSampler(IDS, 7).sample(3, 5) == ClientSampler(IDS, 7).sample(3, 5)


def test_cohort_is_distinct_ids_in_client_order():
  cohort = ClientSampler(IDS, 7).sample(0, 8)
  assert len(set(cohort)) == 8
  assert set(cohort) <= set(IDS)
  assert cohort == sorted(cohort)


def test_rounds_and_seeds_give_different_cohorts():
  sampler = ClientSampler(IDS, 7)
  cohorts = {tuple(sampler.sample(r, 5)) for r in range(10)}
  assert len(cohorts) == 10
  assert sampler.sample(0, 5) != ClientSampler(IDS, 8).sample(0, 5)


def test_whole_population_is_every_client():
  assert ClientSampler(IDS, 1).sample(4, 20) == list(IDS)


def test_counts_over_many_rounds_are_near_uniform():
  sampler = ClientSampler(IDS, 0)
  counts = collections.Counter(c for r in range(4000) for c in sampler.sample(r, 5))
  # Each client is picked with p = 1/4 per round: mean 1000, stddev 27.4.
  assert set(counts) == set(IDS)
  assert all(abs(n - 1000) < 110 for n in counts.values())


@pytest.mark.parametrize("count", [0, 21])
def test_count_outside_population_names_the_key(count):
  with pytest.raises(UserError, match=rf"^clients_per_round: {count} clients per round, but"
                     r" the dataset has 20 clients$"):
    ClientSampler(IDS, 0).sample(0, count)


def test_poisson_round_is_a_pure_function_of_seed_and_round_not_of_count():
  sampler = ClientSampler(IDS, 7, poisson_rate=0.3)
  assert sampler.sample(3, 5) == ClientSampler(IDS, 7, poisson_rate=0.3).sample(3, 20)
  assert sampler.sample(3, 5) != sampler.sample(4, 5)
  cohort = sampler.sample(3, 5)
  assert cohort == sorted(set(cohort)) and set(cohort) <= set(IDS)


def test_poisson_rounds_have_binomial_sizes_and_independent_members():
  """Over 4,000 rounds at q = 0.1 of 20 clients: each client's count is
  Binomial(4000, 0.1) (mean 400, stddev 19), round sizes Binomial(20, 0.1)
  (P(empty) = 0.9^20 = 0.1216), and two clients are together in q^2 of rounds."""
  sampler = ClientSampler(IDS, 0, poisson_rate=0.1)
  rounds = [sampler.sample(r, 2) for r in range(4000)]
  counts = collections.Counter(c for cohort in rounds for c in cohort)
  assert all(abs(counts[c] - 400) < 80 for c in IDS)
  empty = sum(1 for cohort in rounds if not cohort) / len(rounds)
  assert abs(empty - 0.9 ** 20) < 0.02          # stddev 0.0052
  sizes = [len(cohort) for cohort in rounds]
  assert abs(sum(sizes) / len(sizes) - 2.0) < 0.1   # stddev 0.021
  together = sum(1 for cohort in rounds if IDS[0] in cohort and IDS[1] in cohort)
  assert abs(together / len(rounds) - 0.01) < 0.006  # stddev 0.0016


def test_poisson_and_fixed_samples_use_their_own_streams():
  fixed = ClientSampler(IDS, 7)
  poisson = ClientSampler(IDS, 7, poisson_rate=0.25)
  assert [fixed.sample(r, 5) for r in range(5)] != [poisson.sample(r, 5) for r in range(5)]
