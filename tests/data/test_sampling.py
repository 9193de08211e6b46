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
