"""The lossless stage's code, written and read back in NumPy: a canonical Huffman code.

One packed tensor of n symbols of b bits (n and b are known to both sides
from the tensor's spec and the encoder) becomes one bit stream:

- m = max(1, 8 // b) consecutive symbols form a letter of L = m * b bits
  (symbol j of a letter in bits j*b ..), so 1- to 4-bit symbols are coded a
  byte at a time; the last letter is padded with 0 symbols. A Huffman code
  spends at least one bit per letter, so coding 1-bit symbols one by one
  could never go below their raw size.
- 1 flag bit. 0: the n symbols follow raw, b bits each (most significant
  first). 1: the code table, 2**L code lengths of L bits each (0: the letter
  does not occur; a Huffman code over k <= 2**L letters has no code longer
  than k - 1, so L bits hold any length), then each letter's codeword.
  Codewords are canonical (assigned in order of (length, letter)), so the
  lengths are the whole table. A single letter that occurs gets length 1.
- The encoder picks whichever of the two is shorter.

So a coded tensor takes 1 + min(n * b, 2**L * L + sum over letters of
count x code length) bits: `coded_bits`. `fedsim.compression.lossless`
computes the same number inside the round from the letters' histogram;
`encode` writes the stream and `decode` reads it back, which tests run on
every encoder that packs symbols.
"""

from __future__ import annotations

import heapq
import math

import numpy as np


def letter_layout(bits: int) -> tuple[int, int]:
  """(symbols per letter, bits per letter) for `bits`-bit symbols."""
  per = max(1, 8 // bits)
  return per, per * bits


def to_letters(symbols: np.ndarray, bits: int) -> np.ndarray:
  """int64: `symbols` grouped into letters (see the module docstring), zero-padded."""
  per, _ = letter_layout(bits)
  flat = np.asarray(symbols, np.int64).reshape(-1)
  padded = np.concatenate([flat, np.zeros(-flat.size % per, np.int64)])
  shifts = np.arange(per, dtype=np.int64) * bits
  return (padded.reshape(-1, per) << shifts).sum(axis=1)


def code_lengths(counts: np.ndarray) -> np.ndarray:
  """int64[len(counts)]: Huffman code lengths for letter `counts` (0 where a count is 0;
  1 for a single letter that occurs)."""
  counts = np.asarray(counts, np.int64)
  lengths = np.zeros(counts.size, np.int64)
  used = np.flatnonzero(counts)
  if used.size == 1:
    lengths[used] = 1
  # Each heap item: (weight, tie-break, the letters below it).
  heap = [(int(counts[i]), int(i), [int(i)]) for i in used]
  heapq.heapify(heap)
  while len(heap) > 1:
    wa, ta, a = heapq.heappop(heap)
    wb, tb, b = heapq.heappop(heap)
    lengths[a + b] += 1
    heapq.heappush(heap, (wa + wb, min(ta, tb), a + b))
  return lengths


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
  """int64: each letter's canonical codeword (its low `lengths[i]` bits; 0 if unused)."""
  codes = np.zeros(len(lengths), np.int64)
  code, previous = 0, 0
  for letter in sorted(np.flatnonzero(lengths), key=lambda i: (lengths[i], i)):
    code <<= int(lengths[letter]) - previous
    codes[letter] = code
    previous = int(lengths[letter])
    code += 1
  return codes


def _bits_of(values: np.ndarray, widths: np.ndarray) -> np.ndarray:
  """uint8 0/1: each value written in its width's bits, most significant first."""
  widths = np.asarray(widths, np.int64)
  values = np.repeat(np.asarray(values, np.int64), widths)
  starts = np.repeat(np.cumsum(widths) - widths, widths)
  position = np.arange(values.size) - starts          # bit j of its value
  return ((values >> (np.repeat(widths, widths) - 1 - position)) & 1).astype(np.uint8)


def encode(symbols: np.ndarray, bits: int) -> np.ndarray:
  """The coded stream of `symbols` (integers in [0, 2**bits)), as uint8 0/1 bits."""
  flat = np.asarray(symbols, np.int64).reshape(-1)
  if flat.size == 0:
    return np.zeros(0, np.uint8)
  _, letter_bits = letter_layout(bits)
  letters = to_letters(flat, bits)
  lengths = code_lengths(np.bincount(letters, minlength=2**letter_bits))
  payload = int((lengths[letters]).sum())
  if flat.size * bits <= 2**letter_bits * letter_bits + payload:
    raw = _bits_of(flat, np.full(flat.size, bits))
    return np.concatenate([[0], raw]).astype(np.uint8)
  table = _bits_of(lengths, np.full(lengths.size, letter_bits))
  codes = canonical_codes(lengths)
  return np.concatenate([[1], table, _bits_of(codes[letters], lengths[letters])]).astype(np.uint8)


def _read(stream: np.ndarray, start: int, count: int, width: int) -> np.ndarray:
  """`count` unsigned integers of `width` bits from `stream` at bit `start`."""
  chunk = stream[start:start + count * width].astype(np.int64).reshape(count, width)
  return (chunk << np.arange(width - 1, -1, -1, dtype=np.int64)).sum(axis=1)


def decode(stream: np.ndarray, count: int, bits: int) -> np.ndarray:
  """int64[count]: the symbols `encode` wrote into `stream`.

  Raises:
    ValueError: if the stream ends early or has bits left over.
  """
  stream = np.asarray(stream, np.uint8)
  if count == 0:
    return np.zeros(0, np.int64)
  per, letter_bits = letter_layout(bits)
  if stream[0] == 0:
    used = 1 + count * bits
    symbols = _read(stream, 1, count, bits)
  else:
    lengths = _read(stream, 1, 2**letter_bits, letter_bits)
    codes = canonical_codes(lengths)
    letter_of = {(int(lengths[i]), int(codes[i])): i for i in np.flatnonzero(lengths)}
    letters = np.zeros(math.ceil(count / per), np.int64)
    used = 1 + 2**letter_bits * letter_bits
    for k in range(letters.size):
      code = length = 0
      while (length, code) not in letter_of:
        if used >= stream.size or length > letter_bits * 2**letter_bits:
          raise ValueError("the stream ends inside a codeword")
        code, length, used = (code << 1) | int(stream[used]), length + 1, used + 1
      letters[k] = letter_of[(length, code)]
    shifts = np.arange(per, dtype=np.int64) * bits
    symbols = ((letters[:, None] >> shifts) & (2**bits - 1)).reshape(-1)[:count]
  if used != stream.size:
    raise ValueError(f"{stream.size - used} bits left over after {count} symbols")
  return symbols


def coded_bits(symbols: np.ndarray, bits: int) -> int:
  """Bits of `encode(symbols, bits)`: 1 + min(raw, table + payload); 0 for no symbols."""
  return int(encode(symbols, bits).size)
