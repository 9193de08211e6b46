"""Client profiles: seeded per client, persistent across rounds, or read from a trace."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedsim.experiment.config.loader import load_config
from fedsim.errors import UserError
from fedsim.system.profiles import (ClientProfile, LogNormal, ProfilesConfig, Uniform,
                                    draw_profile, profile_source, round_links)
from tests.config.test_config import BASE

HEADER = "client_id,compute_speed,down_bps,up_bps,latency_s,availability\n"


def _trace(tmp_path, rows, header=HEADER):
  path = tmp_path / "trace.csv"
  path.write_text(header + "".join(r + "\n" for r in rows))
  return str(path)


def test_profiles_depend_on_seed_and_client_only():
  config = ProfilesConfig(up_bps=LogNormal(1e6, 0.8), availability=Uniform(0.5, 1.0))
  ids = [f"client_{i}" for i in range(300)]
  forward = [draw_profile(config, 3, cid) for cid in ids]
  backward = [draw_profile(config, 3, cid) for cid in reversed(ids)][::-1]
  assert forward == backward  # not a function of draw order or population
  assert draw_profile(config, 4, "client_0") != forward[0]
  assert len({p.up_bps for p in forward}) == len(ids)
  assert {p.down_bps for p in forward} == {20e6}  # sigma 0: the median itself
  assert all(0.5 <= p.availability <= 1.0 for p in forward)


def test_lognormal_bandwidth_has_the_configured_median_and_sigma():
  config = ProfilesConfig(up_bps=LogNormal(1e6, 0.5))
  logs = np.log([draw_profile(config, 0, f"c{i}").up_bps for i in range(4000)])
  # log(up) ~ N(log 1e6, 0.5^2): standard errors of mean and std are ~0.008 and ~0.006.
  assert abs(np.median(logs) - np.log(1e6)) < 0.04
  assert abs(np.std(logs) - 0.5) < 0.03


def test_jitter_and_availability_are_seeded_per_round_and_client():
  profile = ClientProfile(1.0, 8e6, 1e6, 0.0, 0.25)
  steady = ProfilesConfig()
  jittery = ProfilesConfig(jitter=0.3)
  links = round_links(steady, profile, 0, 1, "a")
  assert (links.down_bps, links.up_bps) == (8e6, 1e6)
  r1 = round_links(jittery, profile, 0, 1, "a")
  assert r1 == round_links(jittery, profile, 0, 1, "a")
  assert r1.up_bps != round_links(jittery, profile, 0, 2, "a").up_bps
  assert r1.up_bps != round_links(jittery, profile, 0, 1, "b").up_bps
  online = np.mean([round_links(steady, profile, 0, r, "a").online for r in range(2000)])
  assert abs(online - 0.25) < 0.04  # binomial standard error ~0.01


def test_trace_is_read_and_must_match_the_data(tmp_path):
  path = _trace(tmp_path, ["b,2,1e7,5e5,0.1,0.9", "a,1,2e7,1e6,0.05,1"])
  config = ProfilesConfig(source="trace", trace=path)
  of = profile_source(config, 0, ["a", "b"])
  assert of("a") == ClientProfile(1.0, 2e7, 1e6, 0.05, 1.0)
  assert of("b") == ClientProfile(2.0, 1e7, 5e5, 0.1, 0.9)
  with pytest.raises(UserError, match=re.escape(f"{path} lists client 'b', which is not in")):
    profile_source(config, 0, ["a"])
  with pytest.raises(UserError, match=re.escape(f"{path} has no row for client 'c'")):
    profile_source(config, 0, ["a", "b", "c"])


@pytest.mark.parametrize("rows,header,expected", [
    (["a,1,1e6,1e6,0,1"], "client_id,compute_speed,down_bps,latency_s,availability\n",
     "missing column 'up_bps'"),
    (["a,1,fast,1e6,0,1"], HEADER, "trace.csv:2: down_bps must be a number, got 'fast'"),
    (["a,1,1e6,0,0,1"], HEADER, "trace.csv:2: up_bps must be > 0, got 0"),
    (["a,1,1e6,1e6,0,1.5"], HEADER, "trace.csv:2: availability must be between 0 and 1"),
    (["a,1,1e6,1e6,0,1", "a,1,1e6,1e6,0,1"], HEADER, "trace.csv:3: client 'a' is listed twice"),
    ([], HEADER, "the profile trace has no clients"),
])
def test_bad_traces_are_one_line_errors(tmp_path, rows, header, expected):
  path = _trace(tmp_path, rows, header)
  with pytest.raises(UserError, match=re.escape(expected)) as e:
    ProfilesConfig(source="trace", trace=path).check("system.profiles")
  assert "\n" not in str(e.value)


def test_profile_config_keys(tmp_path):
  config, _ = load_config(BASE, ["system.profiles={up_bps: {median: 1e6, sigma: 0.5}}"])
  assert config.system.profiles.up_bps == LogNormal(1e6, 0.5)
  assert config.system.profiles.down_bps == LogNormal(20e6, 0.0)
  assert load_config(BASE)[0].system.profiles is None
  path = _trace(tmp_path, ["a,1,1e6,1e6,0,1"])
  traced, _ = load_config(BASE, [f"system.profiles={{source: trace, trace: {path}}}"])
  assert traced.system.profiles.trace == path


@pytest.mark.parametrize("override,expected", [
    (["system.profiles={source: trace}"], "system.profiles.trace: missing"),
    (["system.profiles={source: trace, trace: /nonexistent.csv}"],
     "/nonexistent.csv: cannot read the profile trace"),
    (["system.profiles={trace: x.csv}"], "system.profiles.trace: only used with source: trace"),
    (["system.profiles={up_bps: {median: 0}}"], "system.profiles.up_bps.median: must be > 0"),
    (["system.profiles={availability: {low: 0.9, high: 0.5}}"],
     "system.profiles.availability.low: 0.9 is larger than high (0.5)"),
    (["system.profiles={jitter: -1}"], "system.profiles.jitter: must be >= 0"),
])
def test_profile_config_errors(override, expected):
  with pytest.raises(UserError, match=re.escape(expected)):
    load_config(BASE, override)
