"""Entropy-coded bits of quantized symbols against SciPy's entropy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fedsim.sizing.entropy import entropy_bits, raw_bits


def _reference(symbols, alphabet_size):
  """SciPy's empirical entropy, times n (rounded up past float noise of a relative
  1e-9), plus a table of counts; raw when that is larger."""
  n = symbols.size
  counts = np.bincount(symbols, minlength=alphabet_size)
  coded = (math.ceil(n * stats.entropy(counts, base=2) * (1 - 1e-9))
           + alphabet_size * math.ceil(math.log2(n + 1)))
  return min(coded, n * math.ceil(math.log2(alphabet_size)))


@pytest.mark.parametrize("alphabet_size, n, distribution", [
    (256, 20000, "normal"), (4, 20000, "normal"), (16, 5000, "uniform"),
    (3, 10000, "skewed"), (2, 10, "uniform"), (256, 10, "normal"), (1, 100, "uniform"),
])
def test_entropy_bits_equal_scipy_and_never_exceed_raw(alphabet_size, n, distribution):
  rng = np.random.default_rng(alphabet_size + n)
  if distribution == "normal":   # quantization levels of a Gaussian: low entropy
    symbols = np.clip(np.round(rng.normal(alphabet_size / 2, alphabet_size / 8, n)),
                      0, alphabet_size - 1).astype(np.int64)
  elif distribution == "skewed":
    symbols = rng.choice(alphabet_size, n, p=np.linspace(1, 20, alphabet_size) /
                         np.linspace(1, 20, alphabet_size).sum())
  else:
    symbols = rng.integers(0, alphabet_size, n)
  bits = entropy_bits(symbols.astype(np.float32), alphabet_size)
  assert bits == _reference(symbols, alphabet_size)
  assert bits <= raw_bits(n, alphabet_size)


def test_gaussian_levels_code_below_raw():
  symbols = np.clip(np.round(np.random.default_rng(0).normal(128, 16, 20000)), 0, 255)
  assert entropy_bits(symbols, 256) < 0.8 * raw_bits(20000, 256)


def test_a_single_repeated_symbol_costs_only_its_table():
  assert entropy_bits(np.full(1000, 2), 4) == 4 * math.ceil(math.log2(1001))


@pytest.mark.parametrize("symbols", [[0, 4], [-1, 0], [0.5, 1]])
def test_symbols_outside_the_alphabet_are_refused(symbols):
  with pytest.raises(ValueError, match="integers in"):
    entropy_bits(np.array(symbols), 4)


def test_encoded_entropy_counts_the_symbols_the_wire_carries():
  import tensorflow as tf
  from fedsim.compression import parse_direction
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.encoders import encoder_for
  from fedsim.sizing.encoded_entropy import encoded_entropy_bits
  rng = np.random.default_rng(3)
  values = [rng.normal(size=[60, 50]).astype(np.float32), rng.normal(size=[10]).astype(np.float32)]
  direction = parse_direction({"encoder": "uniform", "bits": 4, "min_elements": 100}, "b")
  bits = encoded_entropy_bits(values, direction, seed=5)
  # The symbols are the stochastic levels the encoder decodes from: recover
  # them from the decoded value (min + level * step) under the same seed and index.
  spec = tf.TensorSpec(values[0].shape, tf.float32)
  with te_api.noise_key(5, 0):
    encoder = te_api.simple_encoder(encoder_for(spec, direction), spec)
  decoded = encoder.decode(encoder.encode(tf.constant(values[0]))[0]).numpy()
  low, high = values[0].min(), values[0].max()
  levels = np.round((decoded - low) / (high - low) * 15).astype(np.int64)
  assert bits.raw == 3000 * 4   # the 10-element tensor is sent unencoded
  assert bits.entropy == _reference(levels.reshape(-1), 16)
  assert bits.entropy < bits.raw
