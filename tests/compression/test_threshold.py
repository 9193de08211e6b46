"""`threshold` (strictly more than, as TFF's compression tutorial writes its rule)
next to `min_elements` (at least)."""

from __future__ import annotations

import pytest

from fedsim.compression import parse_direction
from fedsim.errors import UserError


@pytest.mark.parametrize("rule,size,encoded", [
    ({"threshold": 10000}, 10000, False),       # TFF: `num_elements() > 10000`
    ({"threshold": 10000}, 10001, True),
    ({"min_elements": 10000}, 10000, True),
    ({"min_elements": 10000}, 9999, False),
    ({}, 10000, True),                          # default: at least 10,000
    ({"threshold": 0}, 1, True),
    ({"threshold": 0}, 0, False),
])
def test_threshold_is_strict_and_min_elements_is_not(rule, size, encoded):
  spec = parse_direction({"encoder": "uniform", **rule}, "aggregation[0]")
  assert spec.encodes(size) is encoded


def test_encoder_choice_follows_the_rule():
  import tensorflow as tf

  from fedsim.compression.encoders import is_encoded
  spec = tf.TensorSpec([100, 100], tf.float32)
  assert is_encoded(spec, 10000)
  assert not is_encoded(spec, None, threshold=10000)
  assert is_encoded(spec, None, threshold=9999)
  assert not is_encoded(tf.TensorSpec([100, 101], tf.int32), None, threshold=1)


def test_resolved_config_keeps_the_rule_given():
  spec = parse_direction({"encoder": "uniform", "bits": 8, "threshold": 10000}, "c")
  assert spec.to_dict() == {"encoder": "uniform", "threshold": 10000, "bits": 8,
                            "rounding": "stochastic"}
  assert parse_direction(spec.to_dict(), "c") == spec
  assert "threshold" not in parse_direction({"encoder": "uniform"}, "c").to_dict()


@pytest.mark.parametrize("data,message", [
    ({"encoder": "uniform", "threshold": 5, "min_elements": 5},
     "aggregation[0].threshold: give min_elements (at least) or threshold (more than), not both"),
    ({"encoder": "uniform", "threshold": -1}, "aggregation[0].threshold: must be >= 0, got -1"),
])
def test_rule_errors_name_the_key(data, message):
  with pytest.raises(UserError) as error:
    parse_direction(data, "aggregation[0]")
  assert str(error.value) == message
