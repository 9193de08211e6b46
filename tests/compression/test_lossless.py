"""The lossless stage: a canonical Huffman code of the packed symbols, sized in the
round (TensorFlow) and written and read back in NumPy (`fedsim.compression.huffman`)."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.compression import ENCODERS, parse_direction
from fedsim.compression import huffman
from tests.registries import builtin_names

N, SEED = 3000, 11
# Parameters for encoders that need some, and a few widths worth covering.
_PARAMS = {"threshold": [{"tau": 1.0}], "uniform": [{"bits": 1}, {"bits": 3}, {"bits": 8}],
           "qsgd": [{}, {"levels": 1, "bucket": 512}], "eden": [{"bits": 2}],
           "hadamard": [{"bits": 2}], "kashin": [{}]}
# Encoders that bit-pack symbols: every one must round-trip (the test below
# checks this list is what the registry packs, so a new packer is not skipped).
PACKERS = {"uniform", "hadamard", "qsgd", "terngrad", "sign", "drive", "eden", "kashin", "nf4"}


def _tf_bits(symbols, bits):
  import tensorflow as tf
  from fedsim.compression.lossless import huffman_bits
  return int(huffman_bits(tf.constant(np.asarray(symbols, np.int32)), bits))


def test_coded_size_of_a_known_histogram_is_the_hand_computed_huffman_code():
  # 8-bit symbols (one per letter): counts a=500, b=200, c=100, d=100, e=300.
  # Huffman by hand: c+d=200; then b (200) and that node (ties: either) = 400;
  # e+400=700; a+700=1200. Lengths: a 1, e 2, b 3, c 4, d 4.
  symbols = np.repeat([10, 20, 30, 40, 50], [500, 200, 100, 100, 300])
  payload = 500 * 1 + 300 * 2 + 200 * 3 + 100 * 4 + 100 * 4          # 2500
  table = 256 * 8                                                     # a length per letter
  expected = 1 + min(1200 * 8, table + payload)                       # 4549 < 9600 raw
  counts = np.bincount(symbols, minlength=256)
  assert list(huffman.code_lengths(counts)[[10, 50, 20, 30, 40]]) == [1, 2, 3, 4, 4]
  assert huffman.coded_bits(symbols, 8) == expected == 4549
  assert _tf_bits(symbols, 8) == expected
  # 1-bit symbols go 8 to a letter, the first in the letter's lowest bit:
  # 700 letters of eight 0s and 300 of (1, 0, ..., 0): letters 0 and 1, one bit each.
  ones = np.zeros((1000, 8), np.int64)
  ones[700:, 0] = 1
  assert set(huffman.to_letters(ones.reshape(-1), 1)) == {0, 1}
  assert huffman.coded_bits(ones.reshape(-1), 1) == _tf_bits(ones.reshape(-1), 1) == (
      1 + 256 * 8 + 1000)
  # Too few symbols for the table: raw, with the flag.
  assert huffman.coded_bits(symbols[:100], 8) == _tf_bits(symbols[:100], 8) == 1 + 800
  # One letter only: a 1-bit code each (3000 4-bit zeros are 1500 letters).
  assert huffman.coded_bits(np.zeros(3000), 4) == _tf_bits(np.zeros(3000), 4) == (
      1 + 256 * 8 + 1500)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 8, 12])
def test_random_symbols_round_trip_and_size_equally_in_numpy_and_tensorflow(bits):
  rng = np.random.default_rng(bits)
  for n in (1, 13, 2000):
    for symbols in (rng.integers(0, 2**bits, n),
                    np.clip(np.round(rng.normal(2**bits / 2, 2**bits / 20 + 0.3, n)),
                            0, 2**bits - 1).astype(np.int64)):
      stream = huffman.encode(symbols, bits)
      np.testing.assert_array_equal(huffman.decode(stream, n, bits), symbols)
      assert stream.size == _tf_bits(symbols, bits) <= 1 + n * bits


def test_decode_refuses_a_cut_stream():
  symbols = np.repeat([0, 1, 2, 3], [9000, 500, 300, 200])
  stream = huffman.encode(symbols, 2)
  assert stream[0] == 1
  with pytest.raises(ValueError):
    huffman.decode(stream[:-3], symbols.size, 2)
  with pytest.raises(ValueError):
    huffman.decode(np.concatenate([stream, [0]]), symbols.size, 2)


def _cases():
  return [(name, params) for name in builtin_names(ENCODERS)
          for params in _PARAMS.get(name, [{}])]


def _packed(name, params, value):
  """(NumPy symbols, bits) of each bit-packed output of encoding `value`."""
  import tensorflow as tf
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.bit_packing import packed_symbols
  from fedsim.compression.encoders import encoder_for
  direction = parse_direction({"encoder": name, "min_elements": 10, **params}, "aggregation[0]")
  spec = tf.TensorSpec(value.shape, tf.float32)
  with te_api.noise_key(SEED, 0):
    encoder = encoder_for(spec, direction)
  with te_api.noise_round(0):
    packed = packed_symbols(encoder, tf.constant(value))
  return [(np.round(s.numpy()).astype(np.int64).reshape(-1), b) for s, b in packed]


def test_every_packing_encoder_of_the_registry_is_covered():
  value = np.random.default_rng(0).normal(size=64).astype(np.float32)
  assert {name for name, params in _cases() if _packed(name, params, value)} == PACKERS


@pytest.mark.parametrize("name,params", [c for c in _cases() if c[0] in PACKERS])
def test_every_packing_encoders_symbols_round_trip_through_the_code(name, params):
  rng = np.random.default_rng(3)
  value = (rng.standard_t(3, size=N) * 0.01).astype(np.float32)   # heavy tails, as updates
  packed = _packed(name, params, value)
  assert packed
  for symbols, bits in packed:
    stream = huffman.encode(symbols, bits)
    np.testing.assert_array_equal(huffman.decode(stream, symbols.size, bits), symbols)
    assert stream.size == _tf_bits(symbols, bits)


def test_the_round_counts_each_clients_code(tff_runtime):
  """In an encoded sum on TFF's C++ worker: the clients' codes, summed and their max."""
  del tff_runtime
  import tensorflow_federated as tff
  from fedsim.compression.mean import build_encoded_sum
  direction = parse_direction({"encoder": "uniform", "bits": 4, "min_elements": 100,
                               "lossless": "huffman"}, "aggregation[0]")
  process = build_encoded_sum(direction, SEED).create(tff.TensorType(np.float32, [N]))
  rng = np.random.default_rng(5)
  clients = [(rng.standard_t(3, size=N) * scale).astype(np.float32) for scale in (0.01, 1.0)]
  wire = process.next(process.initialize(), clients).measurements["wire"]
  coded = [sum(huffman.coded_bits(s, b) for s, b in _packed("uniform", {"bits": 4}, x))
           for x in clients]
  assert wire["coded_bits"] == sum(coded)
  assert wire["max_client_bits"] == max(coded)
  assert wire["packed_symbols"] == 2 * N
  assert wire["coded_bits"] < wire["packed_bits"] == 2 * 32 * -(-N * 4 // 28)


def test_lossless_is_a_checked_key():
  from fedsim.errors import UserError
  spec = parse_direction({"encoder": "sign", "lossless": "huffman"}, "aggregation[0]")
  assert spec.lossless == "huffman" and spec.to_dict()["lossless"] == "huffman"
  assert "lossless" not in parse_direction({"encoder": "sign"}, "b").to_dict()
  with pytest.raises(UserError, match=r"^aggregation\[0\]\.lossless: expected none or huffman"):
    parse_direction({"encoder": "sign", "lossless": "ans"}, "aggregation[0]")
