"""What an encoded value puts on the wire, measured from the value itself (TensorFlow).

Measured where an encoded value is at hand without sending anything more:
the server's accumulate of an encoded sum (each client's upload, before it
is decoded and summed) and the server's encode of a broadcast. Per value, in
bits (int64):

- `packed_bits`: the int32 words that carry bit-packed symbols, 32 bits each;
- `entropy_bits`: what an entropy coder would send for those symbols instead,
  per packed tensor, as `fedsim.sizing.entropy.entropy_bits` defines it (this
  is its TensorFlow twin, tested equal to it); never above the symbols' raw
  bits, so never above `packed_bits`;
- `variable_bits`: the tensors whose shape depends on the values (e.g.
  threshold sparsification), their actual elements x dtype bits; static
  sizing of the compiled round cannot see these;
- `coded_bits`: what is sent for the packed symbols: `packed_bits`, or with
  the lossless stage (`lossless: huffman`) the bits of their Huffman code
  (`fedsim.compression.lossless`);
- `packed_symbols`: how many symbols were measured (0: the encoders pack
  nothing tensor_encoding's bit packing shows, so `entropy_bits` measured nothing);
- `max_client_bits`: the largest `variable_bits + coded_bits` of one value
  (one client's upload): sums of values add the other keys and keep this max.

Floats (scales, kept values), indices, seeds and unencoded tensors are not
entropy-coded.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import tensorflow as tf

from fedsim.compression import bit_packing
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.lossless import huffman_bits

KEYS = ("packed_bits", "entropy_bits", "variable_bits", "coded_bits", "packed_symbols",
        "max_client_bits")
_MAX_KEYS = ("max_client_bits",)
# n * H is rounded up after dropping this relative part of it (see
# `fedsim.sizing.entropy`): NumPy's and TensorFlow's float rounding differ far below it.
RELATIVE_SLACK = 1e-9


def entropy_bits(symbols: tf.Tensor, alphabet_size: int) -> tf.Tensor:
  """int64: the bits an entropy coder sends for `symbols` (int32[n], n static, in
  [0, alphabet_size)): min(raw bits, ceil(n * H) + the code table), as
  `fedsim.sizing.entropy.entropy_bits` computes it in NumPy."""
  n = symbols.shape.num_elements()
  if not n:
    return tf.constant(0, tf.int64)
  raw = n * math.ceil(math.log2(alphabet_size))
  table = alphabet_size * math.ceil(math.log2(n + 1))
  counts = tf.math.bincount(symbols, minlength=alphabet_size, maxlength=alphabet_size,
                            dtype=tf.float64)
  p = tf.boolean_mask(counts, counts > 0) / n
  per_symbol = -tf.reduce_sum(p * tf.math.log(p)) / math.log(2.0)
  coded = tf.math.ceil(n * per_symbol * (1 - RELATIVE_SLACK)) + table
  return tf.cast(tf.minimum(coded, float(raw)), tf.int64)


def _dtype_bits(dtype: tf.DType) -> int:
  return 8 if dtype == tf.bool else dtype.size * 8


def zeros() -> dict[str, tf.Tensor]:
  """The measurements of nothing sent."""
  return {k: tf.constant(0, tf.int64) for k in KEYS}


def add(a: Mapping[str, tf.Tensor], b: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """The measurements of both (`max_client_bits`: the larger)."""
  return {k: tf.maximum(a[k], b[k]) if k in _MAX_KEYS else a[k] + b[k] for k in KEYS}


def measure_value(meters, encoded_tensors) -> dict[str, tf.Tensor]:
  """int64 `KEYS` -> bits of one value (one client's upload, or the broadcast):
  each tensor's encoded form measured by its meter."""
  out = zeros()
  for meter, encoded in zip(meters, encoded_tensors):
    out = add(out, meter.measure(encoded))
  out["max_client_bits"] = out["variable_bits"] + out["coded_bits"]
  return out


@dataclasses.dataclass(frozen=True)
class WireMeter:
  """Measures one tensor's encoded value (a flat dict of tensors, as tensor_encoding's
  gather or simple encoder returns it)."""

  # (key suffix, bits per symbol, symbols) of each packed output of static size.
  packed: tuple[tuple[str, int, int], ...] = ()
  # The packed symbols are Huffman-coded (`lossless: huffman`).
  lossless: bool = False

  @classmethod
  def of(cls, encoder: te_api.Encoder, spec: tf.TensorSpec,
         lossless: bool = False) -> "WireMeter":
    """The meter of `encoder` on tensors of `spec` (traces the encoder once)."""
    return cls(tuple((f"{path}/{bit_packing.BITPACKED_KEY}", bits, count)
                     for path, bits, count in bit_packing.packing_layout(encoder, spec)
                     if count is not None), lossless)

  def measure(self, encoded: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """int64 `KEYS` -> bits of this encoded tensor (call inside a TF computation;
    `max_client_bits` is left 0: `measure_value` sets it per value)."""
    out = zeros()
    for key, value in encoded.items():
      value = tf.convert_to_tensor(value)
      for suffix, bits, count in self.packed:
        if key == suffix or key.endswith("/" + suffix):
          words = tf.size(value, out_type=tf.int64) * 32
          symbols = te_api.unpack_symbols(value, bits, count)
          out["packed_bits"] += words
          out["entropy_bits"] += entropy_bits(symbols, 2**bits)
          out["coded_bits"] += huffman_bits(symbols, bits) if self.lossless else words
          out["packed_symbols"] += count
          break
      if not value.shape.is_fully_defined():
        out["variable_bits"] += tf.size(value, out_type=tf.int64) * _dtype_bits(value.dtype)
    return out
