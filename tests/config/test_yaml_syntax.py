"""Config YAML: scientific notation is a number, a duplicate key is an error (no TF)."""

from __future__ import annotations

import pytest

from fedsim.experiment.config.loader import apply_overrides, load_config
from fedsim.experiment.config.yaml_syntax import load
from fedsim.errors import UserError

CONFIG = """\
name: t
rounds: 2
clients_per_round: 2
data: {name: digits, num_clients: 4}
model: mlp
algorithm:
  name: fedavg
  client_optimizer: {name: adam, learning_rate: 1e-3, epsilon: 1E-8}
"""


@pytest.mark.parametrize("text,expected", [
    ("1e-3", 1e-3), ("1E-3", 1e-3), ("2.5e+2", 250.0), ("-1e2", -100.0), ("+4e1", 40.0),
    (".5e1", 5.0), ("3e0", 3.0), ("1.5", 1.5), ("7.", 7.0), ("1.0e-07", 1e-7)])
def test_scientific_notation_is_a_float(text, expected):
  value = load(f"x: {text}")["x"]
  assert type(value) is float and value == expected


@pytest.mark.parametrize("text,expected", [
    ("10", 10), ("1_000", 1000), ("0x10", 16), ("1e", "1e"), ("e3", "e3"), ("1e3x", "1e3x"),
    ("'1e-3'", "1e-3"), ("1.2.3", "1.2.3")])
def test_other_scalars_keep_their_types(text, expected):
  value = load(f"x: {text}")["x"]
  assert type(value) is type(expected) and value == expected


def test_config_and_set_accept_scientific_notation(tmp_path):
  path = tmp_path / "c.yaml"
  path.write_text(CONFIG)
  config, _ = load_config(path)
  adam = config.algorithm.params.client_optimizer.params
  assert (adam.learning_rate, adam.epsilon) == (0.001, 1e-8)
  config, _ = load_config(path, ["algorithm.client_optimizer.learning_rate=5e-4", "rounds=1e1"])
  assert config.algorithm.params.client_optimizer.params.learning_rate == 0.0005
  assert config.rounds == 10 and type(config.rounds) is int


def test_duplicate_key_names_key_and_line(tmp_path):
  path = tmp_path / "config.yaml"
  path.write_text(CONFIG + "eval: {every: 1}\nrounds: 3\n")  # line 10
  with pytest.raises(UserError) as e:
    load_config(path)
  assert str(e.value) == f"{path}: line 10: duplicate key 'rounds'"
  path.write_text(CONFIG.replace("model: mlp", "model: {name: mlp,\n  name: cnn}"))
  with pytest.raises(UserError, match=r"config.yaml: line 6: duplicate key 'name'$"):
    load_config(path)


def test_merge_keys_may_still_be_overridden():
  data = load("base: &b {a: 1, b: 2}\nderived:\n  <<: *b\n  a: 3\n")
  assert data["derived"] == {"a": 3, "b": 2}


def test_set_value_with_duplicate_key():
  with pytest.raises(UserError, match=r"^--set model={a: 1, a: 2}: duplicate key 'a'$"):
    apply_overrides({}, ["model={a: 1, a: 2}"])
