"""The simulated device model: who is aggregated, who is late, who failed."""

from __future__ import annotations

import re

import pytest

from fedsim.config.loader import load_config
from fedsim.errors import UserError
from fedsim.experiment.system import SystemConfig, simulate_round
from tests.config.test_config import BASE

IDS = [f"c{i}" for i in range(6)]
EXAMPLES = {cid: float(10 * (i + 1)) for i, cid in enumerate(IDS)}  # c0 least work


def test_constant_speed_aggregates_the_least_work_first():
  out = simulate_round(SystemConfig(speed="constant", seconds_per_example=0.5), IDS, EXAMPLES,
                       clients_per_round=4, seed=0, round_num=1)
  assert out.aggregated == ("c0", "c1", "c2", "c3")
  assert out.late == ("c4", "c5") and out.failed == ()
  assert out.round_seconds == 40 * 0.5  # the 4th finisher
  assert not out.skipped


def test_lognormal_is_seeded_and_keeps_sampled_order():
  config = SystemConfig(speed="lognormal", sigma=1.0)
  a = simulate_round(config, IDS, EXAMPLES, 3, seed=5, round_num=2)
  b = simulate_round(config, IDS, EXAMPLES, 3, seed=5, round_num=2)
  c = simulate_round(config, IDS, EXAMPLES, 3, seed=5, round_num=3)
  assert a == b and a.completion_seconds != c.completion_seconds
  assert list(a.aggregated) == [cid for cid in IDS if cid in a.aggregated]
  finish = sorted(a.completion_seconds.values())
  assert a.round_seconds == finish[2]
  assert set(a.aggregated) == {cid for cid, s in a.completion_seconds.items() if s <= finish[2]}


def test_dropouts_and_skipped_rounds():
  config = SystemConfig(dropout_probability=0.9, min_clients=3)
  outcomes = [simulate_round(config, IDS, EXAMPLES, 4, seed=1, round_num=r) for r in range(1, 30)]
  skipped = [o for o in outcomes if o.skipped]
  assert skipped and all(o.aggregated == () for o in skipped)
  assert all(len(o.failed) + len(o.late) + len(o.aggregated) == 6 for o in outcomes if not o.skipped)
  assert sum(len(o.failed) for o in outcomes) > 0.8 * 6 * len(outcomes)


@pytest.mark.parametrize("override,expected", [
    (["backup_clients=3"], "backup_clients: clients_per_round + backup_clients = 5 is larger"),
    (["system.speed=gaussian"], "system.speed: unknown speed model 'gaussian'"),
    (["system.min_clients=3"], "system.min_clients: 3 is larger than clients_per_round (2)"),
    (["system.dropout_probability=1"], "system.dropout_probability: must be <= 0.99"),
])
def test_system_config_errors(override, expected):
  with pytest.raises(UserError, match=re.escape(expected)):
    load_config(BASE, override)
