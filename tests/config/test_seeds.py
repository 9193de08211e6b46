"""`seeds:` and `--seeds`: every variant once per seed, named and configured by it."""

from __future__ import annotations

import pytest

from fedsim import cli
from fedsim.errors import UserError
from fedsim.experiment.config.loader import expand_variants, load_config

BASE = {"name": "s", "rounds": 1, "clients_per_round": 2, "seed": 9,
        "data": {"name": "synthetic", "num_clients": 4}, "model": {"name": "logistic"}}


def test_every_variant_runs_once_per_seed_with_that_seed():
  _, raw = load_config(dict(BASE, seeds=[0, 2], variants={"a": {}, "b": {"rounds": 2}}))
  runs = [(name, config.seed, config.rounds) for name, config in expand_variants(raw)]
  assert runs == [("a-seed0", 0, 1), ("a-seed2", 2, 1), ("b-seed0", 0, 2), ("b-seed2", 2, 2)]
  assert [n for n, _ in expand_variants(raw, only="b")] == ["b-seed0", "b-seed2"]


def test_without_variants_runs_are_named_by_seed_and_without_seeds_nothing_changes():
  _, raw = load_config(BASE, ["seeds=[3, 1]"])
  assert [(n, c.seed) for n, c in expand_variants(raw)] == [("seed3", 3), ("seed1", 1)]
  _, raw = load_config(BASE)
  assert [(n, c.seed) for n, c in expand_variants(raw)] == [(None, 9)]


@pytest.mark.parametrize("seeds, message", [
    ([1, 1], "seeds: [1, 1] repeats a seed"),
    ([-1], "seeds: -1 is not in [0, 2**31 - 1]"),
])
def test_bad_seeds_name_the_key(seeds, message):
  with pytest.raises(UserError) as e:
    load_config(dict(BASE, seeds=seeds))
  assert str(e.value) == message


def test_cli_seeds_flag(tmp_path, capsys):
  path = tmp_path / "c.yaml"
  path.write_text("name: s\nrounds: 1\nclients_per_round: 2\n"
                  "data: {name: synthetic, num_clients: 4}\nmodel: {name: logistic}\n")
  assert cli.main(["validate", str(path), "--seeds", "0,1,2"]) == 0
  assert "3 runs: seed0, seed1, seed2" in capsys.readouterr().out
  with pytest.raises(SystemExit) as e:
    cli.main(["validate", str(path), "--seeds", "0,x"])
  assert e.value.code == 2


def test_data_describe_shows_the_first_seeds_data(tmp_path, capsys):
  path = tmp_path / "c.yaml"
  path.write_text("name: s\nrounds: 1\nclients_per_round: 2\nseeds: [3, 4]\n"
                  "data: {name: synthetic, num_clients: 4}\nmodel: {name: logistic}\n")
  assert cli.main(["data", "describe", str(path), "--png", str(tmp_path / "d.png")]) == 0
  assert capsys.readouterr().out.startswith("dataset: synthetic (seed 3)")


@pytest.mark.parametrize("config, overrides, message", [
    # A variant's own seeds replaced the config's (and --seeds) for it alone.
    (dict(BASE, variants={"a": {}, "b": {"seeds": [5]}}), ["seeds=[0, 1]"],
     "variants.b: a variant may not set 'seeds' (every variant runs once per seed of the"
     " config's seeds)"),
    # A variant's seed was dropped without a word for each of the seeds.
    (dict(BASE, seeds=[0, 1], variants={"a": {}, "b": {"seed": 3}}), [],
     "variants.b: a variant may not set 'seed' when the config runs seeds [0, 1] (each"
     " replaces it)"),
    (dict(BASE, variants={"a": {}, "b": {"seed": 3}}), ["seeds=[0, 1]"],   # --seeds 0,1
     "variants.b: a variant may not set 'seed' when the config runs seeds [0, 1] (each"
     " replaces it)"),
])
def test_a_variants_seed_that_the_seeds_would_silently_replace_is_refused(
    config, overrides, message):
  with pytest.raises(UserError) as error:
    load_config(config, overrides)
  assert str(error.value) == message
  _, raw = load_config(dict(BASE, variants={"a": {}, "b": {"seed": 3}}))   # without seeds: its own
  assert [(n, c.seed) for n, c in expand_variants(raw)] == [("a", 9), ("b", 3)]
