"""`sampling: fixed | poisson` and the DP stage's `accountant`: parsed, and
every combination fedsim cannot account refused in one line naming the key."""

from __future__ import annotations

import pytest

from fedsim.errors import UserError
from fedsim.experiment.config.loader import load_config

DP = {"name": "dp_gaussian", "noise_multiplier": 1.0, "clip": 0.5}
BASE = {
    "name": "t", "seed": 0, "rounds": 2, "clients_per_round": 2,
    "data": {"name": "digits", "num_clients": 8, "partition": "iid", "batch_size": 8},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg", "client_weighting": "uniform",
                  "client_optimizer": {"name": "sgd", "learning_rate": 0.1}},
    "aggregation": [DP],
}


def _error(overrides, raw=BASE):
  with pytest.raises(UserError) as e:
    load_config(raw, overrides)
  assert "\n" not in str(e.value)
  return str(e.value)


def test_fixed_is_the_default_and_has_no_rate():
  config, _ = load_config(BASE)
  assert config.sampling == "fixed" and config.poisson_rate(8) is None
  assert config.aggregation[0].params.accountant == "rdp"


def test_poisson_rate_defaults_to_the_expected_share_of_clients():
  config, _ = load_config(BASE, ["sampling=poisson"])
  assert config.poisson_rate(8) == 0.25
  config, _ = load_config(BASE, ["sampling=poisson", "sampling_rate=0.1"])
  assert config.poisson_rate(8) == 0.1


def test_pld_accountant_parses():
  config, _ = load_config({**BASE, "aggregation": [{**DP, "accountant": "pld"}]})
  assert config.aggregation[0].params.accountant == "pld"


@pytest.mark.parametrize("overrides,raw,expected", [
    (["sampling=uniform"], BASE, "sampling: must be one of"),
    (["sampling_rate=0.1"], BASE, "sampling_rate: only used with sampling: poisson"),
    (["sampling=poisson", "sampling_rate=1.5"], BASE, "sampling_rate: must be <= 1, got 1.5"),
    (["sampling=poisson", "backup_clients=1"], BASE,
     "backup_clients: 1 backup clients with sampling: poisson; over-selection needs a"
     " fixed-size sample (set sampling: fixed, or backup_clients: 0)"),
    (["sampling=poisson"], {**BASE, "aggregation": [
        {"name": "ddp", "noise_multiplier": 1.0, "clip": 1.0, "bits": 16}]},
     "aggregation[0] ddp: its noise is split over exactly clients_per_round clients;"
     " it needs sampling: fixed"),
    (["sampling=poisson"], {**BASE, "aggregation": [], "algorithm": {
        "name": "fedbuff", "client_optimizer": {"name": "sgd", "learning_rate": 0.1}}},
     "sampling: poisson is not used by asynchronous algorithms"),
    ([], {**BASE, "aggregation": [{**DP, "accountant": "moments"}]},
     "aggregation[0].accountant: must be one of"),
])
def test_what_cannot_be_accounted_is_refused_in_one_line(overrides, raw, expected):
  assert expected in _error(overrides, raw)


@pytest.mark.parametrize("overrides", [[], ["sampling=poisson"], ["sampling=poisson",
                                                                  "sampling_rate=0.1"]])
def test_sampling_reads_back_as_written(overrides):
  """`--resume` compares a run's config.yaml with itself: the keys must round-trip."""
  import yaml
  from fedsim.experiment.config.loader import plain
  written = plain(load_config(BASE, overrides)[0])
  again = plain(load_config(yaml.safe_load(yaml.safe_dump(written)))[0])
  assert again == written
  # The rate is written (None: the default) only where it is used.
  assert ("sampling_rate" in written) == (written["sampling"] == "poisson")
