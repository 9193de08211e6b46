"""Quantization levels <-> the knob's units, for the controllers whose papers count levels.

AdaQuantFL's s and DAdaQuant's q are QSGD's level count: a coordinate's
magnitude is rounded to one of the s + 1 points 0, 1/s, ..., 1 of the
vector's norm (s equal intervals), its sign sent apart. fedsim's `bits`
encoders (uniform, hadamard, eden, kashin, ...) put 2**bits points on their
range, i.e. 2**bits - 1 intervals (`fedsim.compression.encoders.
quantization_encoder`). So b bits stand for s = 2**b - 1 levels, and s levels
need the fewest bits with 2**b - 1 >= s: b = ceil(log2(s + 1)). qsgd's
`levels` is s itself (its symbols take ceil(log2(2 s + 1)) bits with the sign).
"""

from __future__ import annotations

import math

from fedsim.control import Knob, clamp
from fedsim.errors import UserError

LEVEL_PARAMS = ("bits", "levels")


def require_levels(knob: Knob, controller: str) -> None:
  """Raises UserError unless the knob counts quantization levels (bits or levels)."""
  if knob.param not in LEVEL_PARAMS:
    raise UserError(f"controller '{controller}' sets a number of quantization levels: it controls"
                    f" 'bits' or 'levels', not '{knob.param}' of encoder '{knob.encoder}'")


def to_levels(value: float, knob: Knob) -> float:
  """The level count s that knob value `value` stands for."""
  return 2.0 ** value - 1.0 if knob.param == "bits" else float(value)


def from_levels(levels: float, knob: Knob) -> float:
  """The knob value for `levels` levels: s rounded half up (at least 1), then
  the fewest bits holding s levels for a bits knob; within the knob's bounds."""
  if math.isnan(levels):
    return levels
  if math.isinf(levels):
    return clamp(levels, knob)
  s = max(1, math.floor(levels + 0.5))
  # For an integer s >= 1, ceil(log2(s + 1)) is its bit length (exact, no float log).
  return clamp(s.bit_length() if knob.param == "bits" else s, knob)
