"""Parsing and validation of the `compression` config section (no TensorFlow)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedsim.compression import (CompressionSpec, DirectionSpec, parse_compression,
                                parse_direction)
from fedsim.compression.encoder_catalog import QuantizationParams
from fedsim.config.typed import Component
from fedsim.errors import UserError
from fedsim.registry import NoParams


def test_both_directions_parse_with_defaults_filled_in():
  spec = parse_compression({
      "broadcast": {"encoder": "uniform", "bits": 8, "min_elements": 10000},
      "aggregation": {"encoder": "hadamard", "bits": 4, "rounding": "deterministic"},
  })
  assert spec == CompressionSpec(
      broadcast=DirectionSpec(Component("uniform", QuantizationParams(8, "stochastic")), 10000),
      aggregation=DirectionSpec(Component("hadamard", QuantizationParams(4, "deterministic")),
                                10000))


@pytest.mark.parametrize("data, expected", [
    (None, CompressionSpec()),
    ({}, CompressionSpec()),
    ({"broadcast": None}, CompressionSpec()),
    ({"aggregation": "identity"},
     CompressionSpec(aggregation=DirectionSpec(Component("identity", NoParams()), 10000))),
    ({"broadcast": {"encoder": "uniform", "min_elements": 0}},
     CompressionSpec(broadcast=DirectionSpec(Component("uniform", QuantizationParams()), 0))),
])
def test_absent_directions_are_none(data, expected):
  assert parse_compression(data) == expected


def test_to_dict_parses_back_to_the_same_spec():
  spec = parse_compression({"broadcast": {"encoder": "hadamard", "bits": 2}})
  assert spec.to_dict() == {"broadcast": {"encoder": "hadamard", "min_elements": 10000,
                                          "bits": 2, "rounding": "stochastic"}}
  assert parse_compression(spec.to_dict()) == spec


@pytest.mark.parametrize("data, message", [
    ({"broadcast": {"encoder": "uniform", "bits": 32}},
     "compression.broadcast.bits: must be <= 16, got 32"),
    ({"aggregation": {"encoder": "hadamard", "bits": 0}},
     "compression.aggregation.bits: must be >= 1, got 0"),
    ({"broadcast": {"encoder": "uniform", "bits": 7.5}},
     "compression.broadcast.bits: expected an integer, got 7.5"),
    ({"broadcast": {"encoder": "uniform", "min_elements": -1}},
     "compression.broadcast.min_elements: must be >= 0, got -1"),
    ({"aggregation": {"encoder": "unifrom"}},
     "compression.aggregation.encoder: unknown encoder 'unifrom' (did you mean 'uniform'?)"),
    ({"broadcast": {"bits": 8}}, "compression.broadcast.encoder: missing required key"),
    ({"broadcast": {"encoder": "uniform", "bitz": 8}},
     "compression.broadcast.bitz: unknown key for encoder 'uniform' (did you mean 'bits'?)"),
    ({"broadcast": {"encoder": "identity", "bits": 8}},
     "compression.broadcast.bits: unknown key for encoder 'identity'"),
    ({"broadcast": {"encoder": "uniform", "rounding": "nearest"}},
     "compression.broadcast.rounding: must be one of stochastic, deterministic"),
    ({"broadcst": {"encoder": "uniform"}},
     "compression.broadcst: unknown key (did you mean 'broadcast'?)"),
    ({"broadcast": 8}, "compression.broadcast: expected a mapping of keys, got 8"),
    (["uniform"], "compression: expected a mapping of keys, got ['uniform']"),
])
def test_errors_name_the_key(data, message):
  with pytest.raises(UserError) as error:
    parse_compression(data)
  assert str(error.value).startswith(message)
  assert "\n" not in str(error.value)


def test_direction_key_prefix_is_the_callers():
  with pytest.raises(UserError, match=r"^run\.down\.bits: must be <= 16, got 17$"):
    parse_direction({"encoder": "uniform", "bits": 17}, "run.down")


def test_config_validation_does_not_import_tensorflow():
  code = ("import sys, fedsim.compression as c;"
          " c.parse_compression({'broadcast': {'encoder': 'hadamard'}});"
          " print(sorted(m for m in sys.modules if m.startswith(('tensorflow', 'tensor_encoding'))))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True, timeout=60)
  assert out.stdout.strip() == "[]"
