"""Human-readable sizes of communicated data, in bits with binary prefixes."""

from __future__ import annotations

import math

_UNITS = ("bit", "Kibit", "Mibit", "Gibit", "Tibit", "Pibit", "Eibit")


def format_bits(bits: float) -> str:
  """Returns `bits` with a binary prefix and 3 significant digits.

  E.g. 512 -> '512 bit', 1536 -> '1.50 Kibit', 12.3 * 2**20 -> '12.3 Mibit'.
  Whole numbers below 1000 are shown exactly; a value that would round to
  1000 of one unit moves to the next ('0.977 Kibit' for 1000 bits).

  Raises:
    ValueError: if `bits` is NaN or infinite.
  """
  value = float(bits)
  if not math.isfinite(value):
    raise ValueError(f"cannot format {bits} bits")
  if value.is_integer() and abs(value) < 1000:
    return f"{int(value)} bit"
  for unit in _UNITS:
    # '#.3g' turns anything from 999.5 up into '1.00e+03': use the next unit.
    if abs(value) < 999.5 or unit == _UNITS[-1]:
      break
    value /= 1024
  if abs(value) >= 999.5:  # Beyond the largest unit: no exponent notation.
    return f"{value:.0f} {unit}"
  return f"{value:#.3g}".rstrip(".") + f" {unit}"
