"""A key that the chosen entry ignores is an error, not a silent no-op (no TF)."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.experiment.config.loader import expand_variants, load_config, plain
from fedsim.experiment.config.schema import ExperimentConfig
from fedsim.config.typed import parse
from fedsim.data import DATASETS
from fedsim.data.partition import PARTITIONERS
from fedsim.errors import UserError
from fedsim.reporting.hparams import flat_hparams

BASE = {
    "name": "k", "rounds": 1, "clients_per_round": 2,
    "data": {"name": "digits", "num_clients": 4, "partition": "dirichlet", "alpha": 0.3},
    "model": "mlp",
}


def _with(**sections):
  return {**BASE, **sections}


@pytest.mark.parametrize("raw,expected", [
    (_with(data={"name": "digits", "partition": "iid", "alpha": 0.5}),
     "data.alpha: only used with partition: dirichlet"),
    (_with(data={"name": "digits", "alpha": 0.5}),  # iid by default
     "data.alpha: only used with partition: dirichlet"),
    (_with(data={"name": "digits", "partition": "dirichlet", "shards_per_client": 3}),
     "data.shards_per_client: only used with partition: shards"),
    (_with(data={"name": "custom", "builder": "m:f", "partition": "shards", "alpha": 1.0}),
     "data.alpha: only used with partition: dirichlet"),
    (_with(data={"name": "synthetic", "iid": True, "beta": 2.0}),
     "data.beta: only used with iid: false"),
    (_with(system={"speed": "constant", "sigma": 0.8}),
     "system.sigma: only used with speed: lognormal"),
])
def test_ignored_key_is_an_error(raw, expected):
  with pytest.raises(UserError) as e:
    load_config(raw)
  assert str(e.value) == expected


def test_resolved_config_and_hparams_leave_unused_keys_out():
  config, _ = load_config(_with(data={"name": "digits", "num_clients": 4}))
  resolved = plain(config)
  assert resolved["data"]["partition"] == "iid"
  assert "alpha" not in resolved["data"] and "shards_per_client" not in resolved["data"]
  assert "system.sigma" not in flat_hparams(resolved)
  assert parse(ExperimentConfig, resolved).data == config.data  # still round-trips
  dirichlet, _ = load_config(BASE)
  assert plain(dirichlet)["data"]["alpha"] == 0.3
  assert parse(ExperimentConfig, plain(dirichlet)).data == dirichlet.data


def test_set_choice_drops_the_keys_of_the_old_choice():
  config, raw = load_config(BASE, ["data.partition=iid"])
  assert config.data.params.partition == "iid"
  assert "alpha" not in raw["data"]  # so that what runs is what was validated
  assert [c.data.params.partition for _, c in expand_variants(raw)] == ["iid"]
  with pytest.raises(UserError, match=r"^data.alpha: only used with partition: dirichlet$"):
    load_config(BASE, ["data.partition=iid", "data.alpha=0.1"])
  config, _ = load_config(BASE, ["data.partition=shards", "data.shards_per_client=3"])
  assert config.data.params.shards_per_client == 3


def test_variant_choice_drops_inherited_keys_but_refuses_its_own():
  runs = dict(expand_variants(_with(variants={
      "iid": {"data": {"partition": "iid"}}, "skewed": {"data": {"alpha": 0.1}}})))
  assert runs["iid"].data.params.partition == "iid" and "alpha" not in plain(runs["iid"])["data"]
  assert runs["skewed"].data.params.alpha == 0.1
  with pytest.raises(UserError) as e:
    load_config(_with(variants={"v": {"data": {"partition": "iid", "alpha": 0.1}}}))
  assert str(e.value) == "variants.v: data.alpha: only used with partition: dirichlet"


def test_plugin_partitioner_is_a_valid_choice():
  @PARTITIONERS.register("test_halves")
  def halves(labels, params, rng, *, key="data"):
    """First half of the examples to client 0, the rest to the others round-robin."""
    del rng, key
    n = len(labels)
    rest = np.arange(n // 2, n)
    return [np.arange(n // 2)] + [rest[i::params.num_clients - 1]
                                  for i in range(params.num_clients - 1)]

  try:
    config, _ = load_config(_with(data={"name": "digits", "num_clients": 3,
                                        "partition": "test_halves"}))
    data = DATASETS.get("digits").build(config.data.params, config.seed)
    sizes = [len(data.clients[c]) for c in data.client_ids]
    assert sizes == [718, 360, 359]  # 1,437 training images: 718, then 719 dealt 2 ways
    with pytest.raises(UserError, match="data.alpha: only used with partition: dirichlet"):
      load_config(_with(data={"name": "digits", "partition": "test_halves", "alpha": 1.0}))
  finally:
    PARTITIONERS._entries.pop("test_halves")
