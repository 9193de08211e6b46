"""The simulated device model: who is aggregated, who is late, who failed."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from fedsim.experiment.config.loader import load_config
from fedsim.errors import UserError
from fedsim.system.profiles import LogNormal, ProfilesConfig, Uniform
from fedsim.system.clock import SystemConfig, simulate_round
from fedsim.sizing import ClientWireBits, SizeInfo
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
    (["system.deadline_seconds=0"], "system.deadline_seconds: must be > 0, got 0"),
    (["system.late_uploads=maybe"], "system.late_uploads: must be one of aborted, sent"),
])
def test_system_config_errors(override, expected):
  with pytest.raises(UserError, match=re.escape(expected)):
    load_config(BASE, override)


# A constant profile in exact binary fractions, so the expected times are exact.
CONSTANT = ProfilesConfig(compute_speed=LogNormal(2.0), down_bps=LogNormal(2.0**20),
                          up_bps=LogNormal(2.0**16), latency_s=LogNormal(0.125))
WIRE = (2**22, 2**19)  # broadcast, aggregate bits per client
# download 2^22/2^20 + 0.125 = 4.125 s; upload 2^19/2^16 + 0.125 = 8.125 s;
# compute examples x 0.25 / 2 = 1.25 s (c0) ... 7.5 s (c5).
EXPECTED = {cid: 4.125 + EXAMPLES[cid] * 0.25 / 2 + 8.125 for cid in IDS}


def _network(**system):
  return SystemConfig(seconds_per_example=0.25, profiles=CONSTANT, **system)


def test_no_profiles_keeps_the_compute_only_seed_semantics():
  config = SystemConfig(speed="lognormal", sigma=0.7, dropout_probability=0.3)
  out = simulate_round(config, IDS, EXAMPLES, 3, seed=9, round_num=4,
                       wire_bits=(10**9, 10**9), population=IDS)
  rng = np.random.default_rng([9, 10, 4])  # [seed, system stream, round]; 7 was the hold-out's
  slowdown = np.exp(0.7 * rng.standard_normal(6))
  fails = rng.random(6) < 0.3
  assert out.completion_seconds == {c: EXAMPLES[c] * 0.01 * slowdown[i] for i, c in enumerate(IDS)}
  assert out.failed == tuple(c for i, c in enumerate(IDS) if fails[i])
  assert out.uploaded == out.aggregated


def test_constant_speeds_leave_the_stream_to_the_dropouts():
  config = SystemConfig(dropout_probability=0.5)
  out = simulate_round(config, IDS, EXAMPLES, 6, seed=3, round_num=8)
  fails = np.random.default_rng([3, 10, 8]).random(6) < 0.5
  assert out.failed == tuple(c for i, c in enumerate(IDS) if fails[i]) != ()


def test_constant_profile_round_time_is_download_compute_upload():
  out = simulate_round(_network(), IDS, EXAMPLES, 4, seed=0, round_num=1,
                       wire_bits=WIRE, population=IDS)
  assert out.completion_seconds == EXPECTED
  assert out.aggregated == ("c0", "c1", "c2", "c3") and out.late == ("c4", "c5")
  assert out.round_seconds == EXPECTED["c3"] == 17.25  # the 4th finisher


@pytest.mark.parametrize("late_uploads,uploaded", [
    ("aborted", ("c0", "c1")), ("sent", tuple(IDS))])
def test_deadline_drops_later_finishers_and_the_round_lasts_it(late_uploads, uploaded):
  # c0 13.5 s, c1 14.75 s, c2 16 s: only two finish by 15 s.
  out = simulate_round(_network(deadline_seconds=15.0, late_uploads=late_uploads), IDS,
                       EXAMPLES, 4, seed=0, round_num=1, wire_bits=WIRE, population=IDS)
  assert out.aggregated == ("c0", "c1") and out.late == ("c2", "c3", "c4", "c5")
  assert out.round_seconds == 15.0 and not out.skipped
  assert out.uploaded == uploaded


def test_compression_shortens_a_communication_bound_round_by_the_bits_ratio():
  slow_uplink = dataclasses.replace(CONSTANT, latency_s=LogNormal(0.0))
  config = SystemConfig(seconds_per_example=0.25, profiles=slow_uplink)
  full = simulate_round(config, IDS, EXAMPLES, 6, 0, 1, wire_bits=(0, 2**24), population=IDS)
  eighth = simulate_round(config, IDS, EXAMPLES, 6, 0, 1, wire_bits=(0, 2**21), population=IDS)
  # 256 s vs 32 s of upload, + c5's 7.5 s of compute.
  assert (full.round_seconds, eighth.round_seconds) == (263.5, 39.5)


def test_offline_clients_fail_and_a_deadline_round_with_no_reports_lasts_it():
  offline = dataclasses.replace(CONSTANT, availability=Uniform(0.0, 0.0))
  out = simulate_round(SystemConfig(profiles=offline, deadline_seconds=30.0), IDS, EXAMPLES,
                       4, seed=0, round_num=1, wire_bits=WIRE, population=IDS)
  assert out.failed == tuple(IDS) and out.skipped and out.round_seconds == 30.0


def test_round_bits_count_late_uploads_that_were_sent():
  sizes = SizeInfo(per_client=ClientWireBits(broadcast=100, broadcast_model=90,
                                             aggregate=50, aggregate_model=40))
  row = sizes.round_metrics(6, 2, late_uploads=3)
  assert (row["broadcast_bits"], row["aggregate_bits"], row["late_upload_bits"]) == (600, 250, 150)
  assert sizes.round_metrics(6, 2)["aggregate_bits"] == 100
  assert sizes.aggregate_history == [250, 100]
