from __future__ import annotations

import pytest

from fedsim.reporting.units import format_bits


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
