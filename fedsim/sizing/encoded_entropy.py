"""Entropy-coded bits of what an encoder packs, for actual values (TensorFlow, eager).

This re-encodes values outside a round (the round itself measures its
symbols, see `fedsim.compression.wire_meter`): with the same run seed, round
index and tensor indices the noise is the same as in the round (see
`noise_seeds.noise_seed`), so for the broadcast, which encodes the
server's model, these are the symbols that crossed the wire.
Only bit-packed symbols count: floats (scales, top-k values), indices, seeds
and tensors sent unencoded are not entropy-coded here.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf

from fedsim.compression import DirectionSpec
from fedsim.compression import huffman as huffman_code
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.bit_packing import packed_symbols
from fedsim.compression.encoders import encoder_at
from fedsim.sizing.entropy import entropy_bits, raw_bits


@dataclasses.dataclass(frozen=True)
class SymbolBits:
  """Bits of the packed symbols of one encoded value."""

  raw: int       # at the packing's bits per symbol (before 28-in-32 packing)
  entropy: int   # what `entropy_bits` says an entropy coder sends instead
  huffman: int   # the lossless stage's code of them (`fedsim.compression.huffman`)


def encoded_entropy_bits(values: Sequence[np.ndarray], direction: DirectionSpec | None,
                         seed: int = 0, round_index: int | None = None) -> SymbolBits:
  """Raw, entropy-coded and Huffman-coded bits of the symbols `direction` packs for `values`.

  Args:
    values: the value's tensors in flattened (`tf.nest`) order, as the
      encoded broadcast or sum sees them (their index salts the noise).
    direction: the encode stage's spec; None encodes nothing.
    seed: the run seed.
    round_index: the encode stage's round counter (0 for its first encoding);
      None draws the noise without a round.

  Returns:
    The sums over tensors and packed outputs; the alphabet of a b-bit packing
    is 2**b symbols.
  """
  raw = coded = huffman = 0
  for index, value in enumerate(values):
    value = np.asarray(value)
    spec = tf.TensorSpec(value.shape, tf.as_dtype(value.dtype))
    encoder = encoder_at(spec, direction, seed, index)
    with te_api.noise_round(round_index):
      packed = packed_symbols(encoder, tf.constant(value))
    for symbols, bits in packed:
      symbols = np.round(symbols.numpy())
      raw += raw_bits(symbols.size, 2**bits)
      coded += entropy_bits(symbols, 2**bits)
      huffman += huffman_code.coded_bits(symbols.astype(np.int64), bits)
  return SymbolBits(raw=raw, entropy=coded, huffman=huffman)
