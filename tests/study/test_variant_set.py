"""`--variant NAME --set key=value` sets the key of that variant; no TensorFlow."""

from __future__ import annotations

import pytest
import yaml

from fedsim import cli
from fedsim.experiment.config import variant_overrides as per_variant
from fedsim.errors import UserError
from fedsim.experiment.config.loader import expand_variants, plain

CONFIG = {
    "name": "vs", "rounds": 3, "clients_per_round": 2,
    "data": {"name": "digits", "num_clients": 4, "partition": "iid", "batch_size": 32},
    "model": {"name": "logistic"},
    "variants": {
        "none": {},
        "u8": {"compression": {"aggregation": {"encoder": "uniform", "bits": 8}}},
        "ada": {"aggregation": [{"name": "encode", "encoder": "uniform", "min_elements": 1000,
                                 "bits": {"controller": "adaquantfl", "initial": 1, "max": 8}}]},
    },
}


def _runs(overrides, variant):
  return expand_variants(per_variant.load_for_variant(CONFIG, overrides, variant), only=variant)


def test_a_set_with_variant_changes_that_variant_only():
  # The base has no compression section: laid over the base, this key was an
  # encoder-less section ('compression.aggregation.encoder: missing required key').
  ((name, cfg),) = _runs(["compression.aggregation.bits=2", "rounds=5"], "u8")
  assert name == "u8" and cfg.rounds == 5
  assert plain(cfg)["compression"]["aggregation"]["bits"] == 2
  assert per_variant.variant_overrides(CONFIG, ["compression.aggregation.bits=2", "seeds=[1, 2]",
                                        "variants.none.rounds=1"], "u8") == [
      "variants.u8.compression.aggregation.bits=2", "seeds=[1, 2]", "variants.none.rounds=1"]
  runs = _runs(["seeds=[1, 2]"], "u8")  # a key of the whole config stays global
  assert [name for name, _ in runs] == ["u8-seed1", "u8-seed2"]


def test_a_set_into_a_list_says_how_to_write_it(capsys):
  with pytest.raises(UserError) as raised:
    _runs(["compression.aggregation.bits.initial=2"], "ada")
  assert str(raised.value).endswith(
      "; variant ada has no compression.aggregation.bits: its bits.initial is"
      " aggregation[0].bits.initial, in a list, which --set replaces whole: --variant ada"
      " --set 'aggregation=[{name: encode, encoder: uniform, min_elements: 1000, bits:"
      " {controller: adaquantfl, initial: 2, max: 8}}]'")
  suggested = str(raised.value).split("--set ")[-1].strip("'")
  ((_, cfg),) = _runs([suggested], "ada")  # as printed, it works
  assert plain(cfg)["aggregation"][0]["bits"]["initial"] == 2


def test_an_unknown_variant_is_named_not_created(tmp_path, capsys):
  path = tmp_path / "vs.yaml"
  path.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
  assert cli.main(["validate", str(path), "--variant", "u9", "--set", "rounds=1"]) == 2
  assert capsys.readouterr().err == ("fedsim: error: --variant u9: no such variant; the"
                                     " config's variants: none, u8, ada\n")
