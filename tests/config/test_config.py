"""Config validation: every kind of bad input names its key (no TF needed)."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from fedsim.experiment.config.loader import apply_overrides, expand_variants, load_config, plain
from fedsim.config.typed import parse
from fedsim.experiment.config.schema import ExperimentConfig
from fedsim.errors import UserError

BASE = {
    "name": "t", "seed": 0, "rounds": 2, "clients_per_round": 2,
    "data": {"name": "digits", "num_clients": 4, "partition": "iid", "batch_size": 8},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": 0.1}},
}


def _error(overrides, raw=None):
  with pytest.raises(UserError) as e:
    load_config(raw or BASE, overrides)
  message = str(e.value)
  assert "\n" not in message
  return message


def test_valid_config_parses_with_defaults():
  config, _ = load_config(BASE)
  assert config.algorithm.params.server_optimizer.name == "sgd"
  assert config.algorithm.params.server_optimizer.params.learning_rate == 1.0
  assert config.eval.every == 1
  assert config.compression is None


@pytest.mark.parametrize("override,expected", [
    (["rounds=0"], "rounds: must be >= 1, got 0"),
    (["rounds=two"], "rounds: expected an integer, got 'two'"),
    (["clients_per_round=5"], "clients_per_round: 5 is larger than data.num_clients (4)"),
    (["algorithm.client_optimizer.learning_rate=-0.1"],
     "algorithm.client_optimizer.learning_rate: must be > 0, got -0.1"),
    (["model.name=mpl"], "model.name: unknown model 'mpl' (did you mean 'mlp'?)"),
    (["algorithm.name=fedavgg"], "algorithm.name: unknown algorithm 'fedavgg' (did you mean 'fedavg'?)"),
    (["data.partition=dirichlet", "data.alpha=0"], "data.alpha: must be >= 1e-06, got 0"),
    (["data.partition=iidd"], "data.partition: unknown partition 'iidd' (did you mean 'iid'?)"),
    (["roundz=3"], "roundz: unknown key (did you mean 'rounds'?)"),
    (["model.hidden=[8, x]"], "model.hidden[1]: expected an integer, got 'x'"),
    (["model.nam=mlp"], "model.nam: unknown key (did you mean 'name'?)"),
    (["eval.every=-1"], "eval.every: must be >= 1, got -1"),
    (["name=a/b"], "name: 'a/b' must be letters"),
    (["data=3"], "data: expected a mapping with a 'name' key"),
    (["seed=1.5"], "seed: expected an integer, got 1.5"),
    (["algorithm.client_weighting=examples"], "algorithm.client_weighting: must be one of"),
    (["compression.broadcast.encoder=unifrom"], "compression.broadcast.encoder: unknown encoder 'unifrom' (did you mean 'uniform'?)"),
    (["compression.aggregation.encoder=uniform", "compression.aggregation.bits=32"],
     "compression.aggregation.bits: must be <= 16, got 32"),
])
def test_bad_values_name_the_key(override, expected):
  assert expected in _error(override)


@pytest.mark.parametrize("override, key", [
    (["data.batch_size=99999999999999999999"], "data.batch_size"),
    (["rounds=9223372036854775808"], "rounds"),
    (["eval.every=-9223372036854775809"], "eval.every"),
])
def test_an_integer_beyond_int64_is_refused_before_tensorflow_overflows(override, key):
  """validate said ok; the run then ended in TensorFlow's overflow traceback."""
  value = override[0].split("=", 1)[1]
  assert _error(override) == f"{key}: {value} does not fit in a 64-bit integer (at most 2**63 - 1)"
  assert load_config(BASE, ["rounds=9223372036854775807"])[0].rounds == 2**63 - 1


def test_numpy_numbers_are_numbers():
  """A sweep built with NumPy (np.arange, np.logspace) was refused as 'expected an
  integer, got 2'."""
  import numpy as np
  raw = {**BASE, "rounds": np.int64(3), "algorithm": {
      "name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": np.float32(0.5)}}}
  config, _ = load_config(raw)
  assert config.rounds == 3 and type(config.rounds) is int
  rate = config.algorithm.params.client_optimizer.params.learning_rate
  assert rate == 0.5 and type(rate) is float
  assert "rounds: expected an integer, got True" in _error([], {**BASE, "rounds": np.bool_(True)})


def test_missing_required_key():
  raw = {k: v for k, v in BASE.items() if k != "rounds"}
  assert _error([], raw) == "rounds: missing required key"


@pytest.mark.parametrize("item", ["rounds", "=3", "a..b=1", "rounds.x=1"])
def test_malformed_set(item):
  assert "--set" in _error([item]) or "rounds" in _error([item])


def test_set_parses_typed_values():
  raw = apply_overrides(BASE, ["rounds=3", "data.alpha=0.1", "model.hidden=[4, 5]",
                               "data.shuffle=false", "model=cnn"])
  assert raw["rounds"] == 3 and raw["data"]["alpha"] == 0.1
  assert raw["model"] == "cnn"
  assert raw["data"]["shuffle"] is False
  assert BASE["rounds"] == 2  # the input is not modified


def test_missing_and_bad_files(tmp_path):
  with pytest.raises(UserError, match="config file not found"):
    load_config(tmp_path / "nope.yaml")
  bad = tmp_path / "bad.yaml"
  bad.write_text("name: [unclosed\n")
  with pytest.raises(UserError, match=r"bad.yaml: line \d+ not valid YAML"):
    load_config(bad)
  scalar = tmp_path / "scalar.yaml"
  scalar.write_text("just text\n")
  with pytest.raises(UserError, match="expected a mapping"):
    load_config(scalar)
  unsafe = tmp_path / "unsafe.yaml"
  unsafe.write_text("name: !!python/object/apply:os.system ['true']\n")
  with pytest.raises(UserError, match="not valid YAML"):
    load_config(unsafe)


def test_resolved_config_round_trips():
  config, _ = load_config(BASE, ["compression.broadcast.encoder=uniform"])
  again = parse(ExperimentConfig, plain(config))
  assert again == config


def test_variants_expand_and_validate_each():
  raw = dict(BASE, variants={"none": {}, "u8": {"compression": {"aggregation": {"encoder": "uniform"}}},
                             "adam": {"algorithm": {"client_optimizer": {"name": "adam"}}}})
  runs = expand_variants(raw)
  assert [name for name, _ in runs] == ["none", "u8", "adam"]
  assert runs[0][1].compression is None
  assert runs[1][1].compression.aggregation.encoder.params.bits == 8
  adam = runs[2][1].algorithm.params.client_optimizer
  assert adam.name == "adam" and adam.params.learning_rate == 0.001  # section replaced, not merged
  bad = dict(BASE, variants={"x": {"rounds": 0}})
  assert _error([], bad) == "variants.x: rounds: must be >= 1, got 0"


EXPERIMENTS = sorted((pathlib.Path(__file__).parents[2] / "experiments").glob("**/*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_config_yaml_reads_back_as_written(path):
  # `fedsim run --resume RUN_DIR` reads the run's config.yaml and compares it with
  # itself: each key must come back as it was written (compression: null did not).
  for _, config in expand_variants(load_config(path)[1]):
    written = plain(config)
    written.pop("variants")
    again = plain(load_config(yaml.safe_load(yaml.safe_dump(written)))[0])
    again.pop("variants")
    assert again == written


def test_a_run_directory_written_with_the_old_flat_runtime_section_still_parses():
  """Before runtimes were a registry every config.yaml listed every runtime key;
  those at the values every old run wrote are dropped, any other is refused."""
  from fedsim.experiment.config.loader import parse_config
  old = {"name": "local", "device": "auto", "address": "local", "workers": 2,
         "cpus_per_worker": 1.0, "gpus_per_worker": 0.0, "timeout_s": 1800.0,
         "threads": "clients", "precision": "float32", "max_concurrent_computation_calls": -1}
  base = {"name": "old", "rounds": 1, "clients_per_round": 1,
          "data": {"name": "digits", "num_clients": 4}, "model": {"name": "logistic"}}
  config = parse_config({**base, "runtime": old})
  assert config.runtime.name == "local"
  assert parse_config({**base, "runtime": {**old, "name": "inprocess"}}).runtime.params.device == "auto"
  with pytest.raises(UserError, match="^runtime.workers: unknown key"):
    parse_config({**base, "runtime": {**old, "workers": 4}})


@pytest.mark.parametrize("overrides, given", [
    ("rounds=3", "str 'rounds=3'"),            # was read one character at a time: '--set r'
    ({"rounds": 3}, "dict {'rounds': 3}"),     # was read by its keys alone
    ([3], "list [3]"),
])
def test_overrides_that_are_not_a_list_of_strings_are_named_as_such(overrides, given):
  from fedsim import api
  with pytest.raises(UserError) as error:
    api.validate(BASE, overrides)
  assert str(error.value) == ("overrides: expected a list of 'dotted.key=value' strings, e.g."
                              f" ['rounds=3'], got {given}")
  assert api.validate(BASE, ("rounds=3",)) == ["t"]


@pytest.mark.parametrize("name, message", [
    ("comparison", "variants.comparison: 'comparison' is taken by what fedsim writes beside the"
                   " runs"),   # compare's TensorBoard run wrote its events into that run
    ("study.yaml", "variants.study.yaml: 'study.yaml' is taken by what fedsim writes beside"
                   " the runs"),   # the plan's write failed as the machine's error
    ("-x", "variants.-x: a variant's name starts with a letter or digit and holds only"
           " letters, digits, '_', '-' and '.'"),
])
def test_a_variant_may_not_take_a_name_fedsim_writes_in_the_experiment_directory(name, message):
  assert _error([], {**BASE, "variants": {"a": {}, name: {}}}).startswith(message)


@pytest.mark.parametrize("data", [
    {"name": "digits", "num_clients": 4, "partition": "dirichlet", "alpha": 1e-300},
    {"name": "emnist_synthetic", "alpha": 1e-9},
])
def test_a_dirichlet_alpha_too_small_for_numpys_sampler_is_refused(data):
  """NumPy's Dirichlet sampler stalls below ~1e-8: validate (which builds digits) and
  the run hung."""
  assert _error([], {**BASE, "data": data}) == f"data.alpha: must be >= 1e-06, got {data['alpha']}"


def test_two_controlled_parameters_are_refused_by_validate_as_by_the_run():
  """validate said ok; the run then refused it (one controlled parameter per run)."""
  controlled = {"encoder": "uniform", "min_elements": 10,
                "bits": {"controller": "adaquantfl", "initial": 2, "max": 8}}
  raw = {**BASE, "compression": {"broadcast": controlled, "aggregation": controlled}}
  # Named by the keys the config wrote (they were named by chain position,
  # `broadcast[0].bits`, keys no config has).
  assert _error([], raw) == ("compression.broadcast.bits: one controlled encoder parameter per"
                             " run (compression.aggregation.bits already is)")
  chains = {**BASE, "aggregation": [{"name": "mean"}, {"name": "encode", **controlled}],
            "broadcast": [{"name": "encode", **controlled}]}
  assert _error([], chains) == ("broadcast[0].bits: one controlled encoder parameter per run"
                                " (aggregation[1].bits already is)")


@pytest.mark.parametrize("algorithm, why", [
    ("scaffold", "this algorithm's upload is not a model delta alone, so its clients have no"
                 " residual to carry (fedavg, fedprox and fedsgd do)"),
    ("easgd", "this algorithm's upload is not a model delta alone, so its clients have no"
              " residual to carry (fedavg, fedprox and fedsgd do)"),
    ("fedbuff", "this algorithm's clients keep no state between rounds, so none can keep a"
                " residual (fedavg, fedprox and fedsgd do)"),
    ("fedprox", None),
    ("fedsgd", None),
])
def test_error_feedback_is_refused_by_validate_for_algorithms_without_a_residual(algorithm, why):
  """validate said ok; the run then refused it at its build (in a study: after the
  runs before it)."""
  raw = {**BASE, "algorithm": {"name": algorithm},
         "aggregation": [{"name": "encode", "encoder": "topk", "k": 10,
                          "error_feedback": True}]}
  if why is None:
    load_config(raw)
    return
  assert _error([], raw) == f"aggregation[0].error_feedback: {why}"


def test_error_feedback_behind_another_stage_is_refused_naming_its_stage():
  encode = {"name": "encode", "encoder": "topk", "k": 10, "error_feedback": True}
  chain = {**BASE, "aggregation": [{"name": "clip", "norm": 1.0}, encode]}
  assert _error([], chain) == (
      "aggregation[1].error_feedback: needs the encode stage alone (or after mean); the client"
      " cannot predict what 'clip' does to its update")


def test_a_controller_on_fedbuff_is_refused_by_validate_naming_the_key_the_config_wrote():
  """The run refused it once built (in a study: after the runs before it), naming
  `aggregation[0].bits`, a key no config has."""
  raw = {**BASE, "algorithm": {"name": "fedbuff"}, "compression": {"aggregation": {
      "encoder": "uniform", "bits": {"controller": "adaquantfl", "initial": 2, "max": 8}}}}
  assert _error([], raw) == ("compression.aggregation.bits: a controller needs synchronous"
                             " rounds; algorithm 'fedbuff' applies updates as they arrive")
