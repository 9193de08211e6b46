from __future__ import annotations

import pytest

from fedsim.errors import UserError
from fedsim.reporting.units import format_bits, format_bits_ticks, parse_bits


@pytest.mark.parametrize("bits, text", [
    (0, "0 bit"),
    (512, "512 bit"),
    (999, "999 bit"),
    (0.5, "0.500 bit"),
    (1000, "0.977 Kibit"),
    (1024, "1.00 Kibit"),
    (1536, "1.50 Kibit"),
    (199_210 * 32, "6.08 Mibit"),
    (12.3 * 2**20, "12.3 Mibit"),
    (1023.4 * 2**20, "0.999 Gibit"),
    (4 * 2**30, "4.00 Gibit"),
    (3.5 * 2**40, "3.50 Tibit"),
    (-1536, "-1.50 Kibit"),
    (5000 * 2**60, "5000 Eibit"),
])
def test_format_bits(bits, text):
  assert format_bits(bits) == text


@pytest.mark.parametrize("bits", [float("nan"), float("inf")])
def test_format_bits_rejects_non_finite(bits):
  with pytest.raises(ValueError):
    format_bits(bits)


@pytest.mark.parametrize("values, labels", [
    # The example: not '64.0 Mibit', '128 Mibit', '1.00 Gibit'.
    ([2**26, 2**27, 2**28, 2**29, 2**30],
     ["64 Mibit", "128 Mibit", "256 Mibit", "512 Mibit", "1024 Mibit"]),
    ([512, 1024, 2048], ["512 bit", "1024 bit", "2048 bit"]),
    ([1.5 * 2**20, 3 * 2**20], ["1.5 Mibit", "3.0 Mibit"]),
    # Not powers of two: the smallest tick keeps 3 significant digits.
    ([3e6, 1e7], ["2.86 Mibit", "9.54 Mibit"]),
    # Wider than 5 digits in the smallest's unit: the next unit up, with decimals.
    ([2**17, 2**20, 2**34], ["0.125 Mibit", "1.000 Mibit", "16384.000 Mibit"]),
    ([0, 2**10], ["", "1 Kibit"]),
])
def test_format_bits_ticks(values, labels):
  assert format_bits_ticks(values) == labels


@pytest.mark.parametrize("text, bits", [
    ("5e6", 5e6), ("64Mibit", 2**26), ("1.5 Gibit", 1.5 * 2**30), ("2 MiB", 16 * 2**20),
    ("3 kbit", 3000), ("7bit", 7), ("1 Kibit", 1024), ("1mbit", 1e6),
])
def test_parse_bits(text, bits):
  assert parse_bits(text) == bits


@pytest.mark.parametrize("text", ["lots", "-3", "0", "5e", "12 parsecs", "nan", "inf Mibit"])
def test_parse_bits_rejects(text):
  with pytest.raises(UserError, match=r"^--budget: expected a positive number of bits"):
    parse_bits(text)
