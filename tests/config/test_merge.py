"""One layering rule for variants and `--set`: a changed choice replaces its section (no TF)."""

from __future__ import annotations

import pytest
import yaml

from fedsim import cli
from fedsim.experiment.config.loader import apply_overrides, expand_variants, load_config
from fedsim.experiment.config.merge import deep_merge
from fedsim.errors import UserError

BASE = {
    "name": "m", "rounds": 1, "clients_per_round": 2,
    "data": {"name": "digits", "num_clients": 4, "partition": "dirichlet", "alpha": 0.3},
    "model": {"name": "mlp", "hidden": [8, 8]},
    "algorithm": {"name": "easgd", "moving_rate": 0.2,
                  "client_optimizer": {"name": "sgd", "learning_rate": 0.1, "momentum": 0.9}},
    "compression": {"aggregation": {"encoder": "uniform", "bits": 4, "min_elements": 5}},
}


def test_set_name_replaces_the_section():
  raw = apply_overrides(BASE, ["data.name=emnist", "algorithm.name=fedavg"])
  assert raw["data"] == {"name": "emnist"}
  assert raw["algorithm"] == {"name": "fedavg"}
  config, _ = load_config(BASE, ["data.name=emnist", "algorithm.name=fedavg"])
  assert config.data.name == "emnist" and config.algorithm.name == "fedavg"


def test_same_name_merges_key_by_key():
  raw = apply_overrides(BASE, ["algorithm.client_optimizer.learning_rate=0.5",
                               "algorithm.name=easgd"])
  assert raw["algorithm"] == {"name": "easgd", "moving_rate": 0.2, "client_optimizer": {
      "name": "sgd", "learning_rate": 0.5, "momentum": 0.9}}


@pytest.mark.parametrize("cleared", [{}, None, "none"])
def test_variant_clears_compression(cleared):
  raw = dict(BASE, variants={"plain": {"compression": cleared}})
  ((_, config),) = expand_variants(raw)
  # null is the default (no compression section); {} and none an empty one.
  assert (config.compression is None if cleared is None else
          config.compression.aggregation is None and config.compression.broadcast is None)


def test_variant_switching_encoder_replaces_the_direction():
  raw = dict(BASE, variants={"id": {"compression": {"aggregation": {"encoder": "identity"}}},
                             "bits": {"compression": {"aggregation": {"bits": 8}}}})
  runs = dict(expand_variants(raw))
  assert runs["id"].compression.aggregation.encoder.name == "identity"
  assert runs["id"].compression.aggregation.min_elements == 10000  # the default again
  kept = runs["bits"].compression.aggregation
  assert (kept.encoder.name, kept.encoder.params.bits, kept.min_elements) == ("uniform", 8, 5)


def test_lists_are_replaced_never_merged():
  assert deep_merge(BASE, {"model": {"hidden": [4]}})["model"] == {"name": "mlp", "hidden": [4]}
  stages = {"aggregation": [{"name": "zeroing", "max_norm": 5.0}, {"name": "mean"}]}
  assert deep_merge(stages, {"aggregation": [{"name": "sum"}]}) == {
      "aggregation": [{"name": "sum"}]}


@pytest.mark.parametrize("base,item,expected", [
    ({"model": "mlp"}, "model.hidden=[4]", {"name": "mlp", "hidden": [4]}),
    ({"model": {"name": "mlp", "hidden": [8]}}, "model=cnn", "cnn"),
    ({"model": {"name": "mlp", "hidden": [8]}}, "model=mlp", {"name": "mlp", "hidden": [8]}),
    ({"model": "mlp"}, "model={name: cnn, dense: 4}", {"name": "cnn", "dense": 4}),
    ({"compression": {"aggregation": "uniform"}}, "compression.aggregation.bits=4",
     {"aggregation": {"encoder": "uniform", "bits": 4}}),
])
def test_string_shorthand_is_a_section(base, item, expected):
  key = next(iter(base))
  assert apply_overrides(base, [item])[key] == expected


def test_set_into_a_value_that_is_not_a_section():
  with pytest.raises(UserError, match=r"^--set rounds.x=1: 'rounds' is not a section$"):
    apply_overrides(BASE, ["rounds.x=1"])
  with pytest.raises(UserError, match=r"^--set data.alpha.x.y=1: 'data.alpha' is not a section$"):
    apply_overrides(BASE, ["data.alpha.x.y=1"])


RAY = dict(BASE, runtime={"name": "ray", "workers": 4, "precision": "bfloat16"})


@pytest.mark.parametrize("item,runtime", [
    # Another name: the section becomes that entry at its defaults (workers and
    # precision were set for ray); `--set runtime.name=inprocess` does the same.
    # (inprocess has no workers key: None).
    ("runtime=inprocess", ("inprocess", None, "float32")),
    ("runtime.name=inprocess", ("inprocess", None, "float32")),
    # The same name changes nothing; later items lay keys over the new entry.
    ("runtime=ray", ("ray", 4, "bfloat16")),
    ("runtime=inprocess --set runtime.precision=bfloat16", ("inprocess", None, "bfloat16")),
])
def test_set_section_equals_name(item, runtime):
  config, _ = load_config(RAY, item.split(" --set "))
  params = config.runtime.params
  assert (config.runtime.name, getattr(params, "workers", None), params.precision) == runtime


@pytest.mark.parametrize("item,name", [
    ("model=cnn", "cnn"), ("algorithm=fedavg", "fedavg"), ("data=emnist_synthetic", "emnist_synthetic"),
    ("runtime=inprocess", "inprocess")])
def test_set_section_equals_name_from_the_command_line(tmp_path, capsys, item, name):
  path = tmp_path / "c.yaml"
  path.write_text(yaml.safe_dump({k: v for k, v in BASE.items() if k != "compression"}))
  assert cli.main(["validate", str(path), "--set", item]) == 0, capsys.readouterr().err
  section = item.split("=")[0]
  assert getattr(load_config(path, [item])[0], section).name == name
