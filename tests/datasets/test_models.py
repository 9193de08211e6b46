"""The models added for the TFF datasets: sizes, output shapes, all weights trainable."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.config.typed import parse
from fedsim.errors import UserError
from fedsim.models import MODELS


def keras_model(name, input_shape, num_classes, **params):
  entry = MODELS.get(name)
  return entry.build(parse(entry.params, params, "model"), input_shape, num_classes)


def test_lstm_default_is_tffs_shakespeare_model():
  model = keras_model("lstm", (80,), 90)
  # Embedding 90x8, LSTMs of 256 units (4 gates), dense 256 -> 90.
  expected = 90 * 8 + 4 * 256 * (8 + 256 + 1) + 4 * 256 * (256 + 256 + 1) + 256 * 90 + 90
  assert model.count_params() == expected == 820_522
  assert not model.non_trainable_weights
  assert model(np.zeros((2, 80), np.int32)).shape == (2, 80, 90)


def test_cnn_gn_for_cifar100():
  model = keras_model("cnn_gn", (32, 32, 3), 100)
  convs = 3 * 9 * 32 + 32 * 9 * 64 + 64 * 9 * 128
  norms = 2 * (32 + 64 + 128)
  assert model.count_params() == convs + norms + 128 * 100 + 100 == 106_372
  assert not model.non_trainable_weights
  assert model(np.zeros((2, 32, 32, 3), np.float32)).shape == (2, 100)


@pytest.mark.parametrize("name, params, message", [
    ("lstm", {"units": []}, "model.units: need one or more LSTM sizes"),
    ("cnn_gn", {"filters": [0]}, "model.filters: need one or more filter counts"),
])
def test_bad_sizes_name_the_key(name, params, message):
  with pytest.raises(UserError, match=message):
    parse(MODELS.get(name).params, params, "model")
