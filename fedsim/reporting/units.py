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


# A budget's suffix and its multiplier: binary prefixes as `format_bits` prints
# them, decimal ones (kbit = 1000 bit) as network rates are quoted, and bytes.
_SUFFIXES = {"bit": 1, "b": 1, "": 1,
             **{unit.lower(): 1024**i for i, unit in enumerate(_UNITS)},
             "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
             "byte": 8, "kib": 8 * 2**10, "mib": 8 * 2**20, "gib": 8 * 2**30}


def parse_bits(text: str, key: str = "--budget") -> float:
  """Parses a number of bits with an optional unit: '5e6', '64Mibit', '1.5 Gibit', '2 MiB'.

  Units: bit, Kibit/Mibit/Gibit/Tibit (powers of 1024), kbit/Mbit/Gbit/Tbit
  (powers of 1000), byte, KiB/MiB/GiB (8 bits a byte); case-insensitive.

  Returns:
    The bits, a positive float.

  Raises:
    UserError: one line naming `key` and the text, if it is not such a size.
  """
  from fedsim.errors import UserError  # pylint: disable=g-import-not-at-top
  stripped = str(text).strip()
  number = stripped.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ").strip()
  unit = stripped[len(number):].strip().lower() if number else ""
  if number.lower().endswith("e"):   # '5e' + 'mbit' is no exponent
    number, unit = "", ""
  try:
    value = float(number) * _SUFFIXES[unit]
  except (ValueError, KeyError):
    value = math.nan
  if not math.isfinite(value) or value <= 0:
    raise UserError(f"{key}: expected a positive number of bits such as 5e6 or 64Mibit,"
                    f" got {text!r:.40}")
  return value


def format_bits_ticks(values, max_digits: int = 5) -> list[str]:
  """Labels for the ticks `values` (bits) of one axis, in one unit with the same decimals.

  The unit is the largest binary unit in which the smallest positive tick is
  at least 1, moved up while the largest would need more than `max_digits`
  integer digits. The decimals are the fewest (0 to 4) that show every tick
  exactly (powers of two: 64, 128 ... 1024 Mibit), else the smallest tick's
  third significant digit, at most 4. E.g. 2**26 .. 2**30 bits ->
  '64 Mibit', '128 Mibit', ..., '1024 Mibit'.

  Returns:
    One label per value, in order ('' for ticks not above 0: a log axis has none).
  """
  positive = [float(v) for v in values if v > 0 and math.isfinite(v)]
  if not positive:
    return ["" for _ in values]
  low, high = min(positive), max(positive)
  power = 0
  while power < len(_UNITS) - 1 and low / 1024**(power + 1) >= 1:
    power += 1
  while power < len(_UNITS) - 1 and high / 1024**power >= 10**max_digits:
    power += 1
  scaled = [v / 1024**power for v in positive]
  exact = [d for d in range(5) if all(abs(round(s, d) - s) <= 1e-9 * s for s in scaled)]
  if exact:
    decimals = exact[0]
  else:
    decimals = min(4, max(0, 2 - math.floor(math.log10(min(scaled)))))
  unit = _UNITS[power]
  return [f"{v / 1024**power:.{decimals}f} {unit}" if v > 0 and math.isfinite(v) else ""
          for v in values]
