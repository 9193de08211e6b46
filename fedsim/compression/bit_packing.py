"""What an encoder's bit packing writes: where its packed outputs sit in the
encoded structure, how many symbols of how many bits each holds, and the
symbols themselves for a given value. Built on `tensor_encoding_api`'s
`Encoder` and its reading of a packing stage's bits (`packing_bits`).
"""

from __future__ import annotations

import tensorflow as tf

from fedsim.compression.tensor_encoding_api import Encoder, packing_bits, stages

BITPACKED_KEY = stages.BitpackingEncodingStage.ENCODED_VALUES_KEY


def _without_packing(encoder: Encoder) -> tuple[Encoder, dict[str, int]]:
  """`encoder` with its bit-packing leaves removed, and the bits each packed (by key path)."""
  children, bits = {}, {}
  for key, child in encoder.children.items():
    packed = packing_bits(child.stage)
    if packed is not None and not child.children:
      bits[key] = packed
    else:
      children[key], inner = _without_packing(child)
      bits.update({f"{key}/{k}": b for k, b in inner.items()})
  return Encoder(encoder.stage, children), bits


def packing_layout(encoder: Encoder, spec: tf.TensorSpec) -> list[tuple[str, int, int | None]]:
  """(path, bits, count) of each bit-packed output of `encoder` on a `spec` tensor.

  `path` is the slash-joined key path of the packed tensor in the encoded
  structure (its key ends with `path/BITPACKED_KEY`), `bits` the bits per
  symbol and `count` how many symbols it packs (None when that depends on
  the values). Traced, not run: no noise is drawn.
  """
  unpacked, bits = _without_packing(encoder)
  if not bits:
    return []

  def encode(x):
    encode_params, _ = unpacked.get_params(unpacked.initial_state())
    encoded, _, _ = unpacked.encode(x, encode_params)
    return {path: _find(encoded, path) for path in bits}

  # Without AutoGraph, as TFF traces encoders (its source rewriting was ~40% of
  # this trace's time in a profile of the test suite).
  shapes = tf.function(encode, autograph=False).get_concrete_function(
      tf.TensorSpec(spec.shape, spec.dtype)).structured_outputs
  return [(path, b, shapes[path].shape.num_elements()) for path, b in bits.items()]


def _find(tree, path: str):
  for key in path.split("/"):
    tree = tree[key]
  return tree


def packed_symbols(encoder: Encoder, x: tf.Tensor) -> list[tuple[tf.Tensor, int]]:
  """(symbols, bits) of every bit-packed output of encoding `x` with `encoder`.

  The symbols are what bit packing would write (integers in [0, 2**bits), as
  floats), drawn with the same noise as encoding `x` under the same
  `noise_key`; [] if `encoder` packs nothing.
  """
  unpacked, bits = _without_packing(encoder)
  if not bits:
    return []
  encode_params, _ = unpacked.get_params(unpacked.initial_state())
  encoded, _, _ = unpacked.encode(x, encode_params)
  return [(_find(encoded, path), b) for path, b in bits.items()]
