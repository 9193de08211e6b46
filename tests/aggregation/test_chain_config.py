"""Aggregation chains in configs: what parses, and compositions refused before TF loads."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedsim.experiment.config.loader import load_config
from fedsim.errors import UserError

BASE = {
    "name": "t", "rounds": 1, "clients_per_round": 10,
    "data": {"name": "digits", "num_clients": 20},
    "model": {"name": "logistic"},
}


def _config(**overrides):
  return load_config({**BASE, **overrides})[0]


def test_config_validation_does_not_import_tensorflow():
  script = ("import sys; from fedsim.experiment.config.loader import load_config;"
            f" load_config({dict(BASE, algorithm={'name': 'fedavg', 'client_weighting': 'uniform'}, aggregation=[{'name': 'clip', 'norm': 1.0}, {'name': 'dp_gaussian', 'noise_multiplier': 1.0}, {'name': 'encode', 'encoder': 'uniform'}])!r});"
            " print('tensorflow' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       check=True)
  assert out.stdout.strip() == "False"


def test_compression_shorthand_is_a_final_encode_stage():
  config = _config(aggregation=[{"name": "clip", "norm": 1.0}],
                   compression={"aggregation": {"encoder": "uniform", "bits": 4},
                                "broadcast": {"encoder": "uniform", "bits": 8}})
  assert [s.name for s in config.aggregation_chain()] == ["clip", "encode"]
  assert config.aggregation_chain()[-1].params.encoder.params.bits == 4
  assert [s.name for s in config.broadcast_chain()] == ["encode"]


def test_chains_round_trip_through_the_resolved_config():
  from fedsim.experiment.config.loader import plain
  config = _config(aggregation=[{"name": "zeroing", "max_norm": 5},
                                {"name": "encode", "encoder": "uniform", "bits": 8}])
  resolved = plain(config)
  assert resolved["aggregation"][0] == {"name": "zeroing", "max_norm": 5.0, "norm": "linf"}
  assert resolved["aggregation"][1]["encoder"] == "uniform"
  again = load_config({**BASE, "aggregation": resolved["aggregation"]})[0]
  assert again.aggregation == config.aggregation


@pytest.mark.parametrize("overrides,message", [
    ({"aggregation": [{"name": "dp_gaussian", "noise_multiplier": 1.0, "clip": 1.0}]},
     "aggregation[0] dp_gaussian: differentially private aggregation is unweighted, but"
     " algorithm 'fedavg' weights clients by their examples; set"
     " algorithm.client_weighting: uniform"),
    ({"algorithm": {"name": "easgd"},
      "aggregation": [{"name": "dp_gaussian", "noise_multiplier": 1.0, "clip": 1.0}]},
     "aggregation[0] dp_gaussian: algorithm 'easgd' sums client updates, it does not"
     " average them"),
    ({"aggregation": [{"name": "encode", "encoder": "uniform"}, {"name": "clip", "norm": 1}]},
     "aggregation[0] encode: this stage sends the values and must come last;"
     " it is followed by 'clip'"),
    ({"algorithm": {"name": "fedavg", "client_weighting": "uniform"},
      "aggregation": [{"name": "dp_gaussian", "noise_multiplier": 1.0}]},
     "aggregation[0] dp_gaussian: needs clip: NORM, or a clip stage right before it"),
    ({"algorithm": {"name": "fedavg", "client_weighting": "uniform"},
      "aggregation": [{"name": "dp_gaussian", "noise_multiplier": 1.0, "clip": 1.0},
                      {"name": "clip", "norm": 1.0}]},
     "aggregation[0] dp_gaussian: 'clip' after it would act on clipped, noised values;"
     " put it before the private stage"),
    ({"aggregation": [{"name": "mean"}, "robust"]},
     "aggregation[1] robust: the chain already averages at 'mean'"),
    ({"algorithm": {"name": "fedavg", "client_weighting": "uniform"},
      "aggregation": [{"name": "dp_gaussian", "noise_multiplier": 1.0, "clip": 1.0,
                       "adaptive": True}]},
     "aggregation[0].clipped_count_stddev: 0.5 is too small for adaptive clipping at"
     " noise_multiplier 1; it must be above 0.5 (the default is 0.05 x clients_per_round)"),
    ({"aggregation": [{"name": "encode", "encoder": "uniform"}],
      "compression": {"aggregation": {"encoder": "uniform"}}},
     "compression.aggregation: the aggregation chain already ends in 'encode'; put"
     " {name: encode, ...} there instead"),
    ({"aggregation": [{"name": "clipp", "norm": 1}]},
     "aggregation[0].name: unknown aggregation stage 'clipp' (did you mean 'clip'?)"),
    ({"aggregation": [{"name": "clip", "nrom": 1}]},
     "aggregation[0].nrom: unknown key (did you mean 'norm'?)"),
    ({"aggregation": [{"name": "clip", "norm": 1, "target_quantile": 0.9}]},
     "aggregation[0].target_quantile/learning_rate: only used with adaptive: true"),
    ({"broadcast": [{"name": "encode", "encoder": "uniform"}, {"name": "encode",
                                                                "encoder": "uniform"}]},
     "broadcast: at most one broadcast stage"),
    ({"aggregation": {"name": "clip"}}, "aggregation: expected a list of stages"),
])
def test_impossible_compositions_fail_in_one_line_naming_the_stage(overrides, message):
  with pytest.raises(UserError) as info:
    _config(**overrides)
  assert str(info.value).startswith(message)
  assert "\n" not in str(info.value)


def test_uniform_fedavg_takes_differential_privacy():
  config = _config(algorithm={"name": "fedavg", "client_weighting": "uniform"},
                   aggregation=[{"name": "zeroing", "max_norm": 100.0},
                                {"name": "clip", "norm": 1.0},
                                {"name": "dp_gaussian", "noise_multiplier": 1.0},
                                {"name": "encode", "encoder": "uniform", "bits": 8}])
  assert [s.name for s in config.aggregation] == ["zeroing", "clip", "dp_gaussian", "encode"]
