"""What a lossless entropy coder would send for a tensor's quantized symbols.

Raw bits pack each symbol of an alphabet of size A in ceil(log2 A) bits. A
two-pass (static) entropy coder, e.g. arithmetic coding with the tensor's own
histogram, first sends the histogram (its code table: A counts, each in
ceil(log2(n + 1)) bits) and then the symbols in ceil(n * H) bits, H the
empirical entropy of the histogram in bits per symbol (an arithmetic coder
comes within 2 bits of n * H; those are not counted). n * H is rounded up
after dropping a relative 1e-9 of it, so that an exact integer (equal counts
of 2**k symbols) is not pushed up a bit by float rounding, and the TensorFlow
twin measured inside a round (`fedsim.compression.wire_meter`) gives the same
count. When that total is not
below the raw bits, the coder sends the symbols raw (the one-bit flag saying
which is not counted either), so entropy bits never exceed raw bits.
"""

from __future__ import annotations

import math

import numpy as np

RELATIVE_SLACK = 1e-9


def raw_bits(count: int, alphabet_size: int) -> int:
  """Bits of `count` symbols packed at ceil(log2 alphabet_size) bits each."""
  return count * math.ceil(math.log2(alphabet_size))


def entropy_bits(symbols: np.ndarray, alphabet_size: int) -> int:
  """Bits an entropy coder sends for `symbols` (integers in [0, alphabet_size)).

  Returns:
    min(raw bits, ceil(n * H * (1 - 1e-9)) + alphabet_size * ceil(log2(n + 1))),
    in bits;
    0 for no symbols.

  Raises:
    ValueError: if a symbol is not an integer in [0, alphabet_size), or
      alphabet_size < 1.
  """
  if alphabet_size < 1:
    raise ValueError(f"alphabet_size must be >= 1, got {alphabet_size}")
  flat = np.asarray(symbols).reshape(-1)
  if flat.size == 0:
    return 0
  as_int = flat.astype(np.int64)
  if np.any(as_int != flat) or as_int.min() < 0 or as_int.max() >= alphabet_size:
    raise ValueError(f"symbols must be integers in [0, {alphabet_size})")
  n = flat.size
  counts = np.bincount(as_int, minlength=alphabet_size)
  p = counts[counts > 0] / n
  entropy = float(-(p * np.log2(p)).sum())   # bits per symbol
  table = alphabet_size * math.ceil(math.log2(n + 1))
  return min(raw_bits(n, alphabet_size), math.ceil(n * entropy * (1 - RELATIVE_SLACK)) + table)
