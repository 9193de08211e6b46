"""link_budget against round times computed by hand from each client's links."""

from __future__ import annotations

import pytest

from fedsim.control import CONTROLLERS
from fedsim.errors import UserError
from tests.control.views import client, knob, view


def _decide(the_knob, clients, deadline_s, **params):
  entry = CONTROLLERS.get("link_budget")
  controller = entry.build(entry.params(**params))
  return controller.decide(controller.initial_state(),
                           view(3, the_knob, clients=clients, deadline_s=deadline_s))[1]


def test_each_client_gets_the_largest_bits_that_meet_the_deadline():
  # Upload 1000 bits per bit of precision + 64 bits of scale. Every client downloads
  # 1e6 bits at 1e6 bits/s (1 s), computes 2 s, and waits 0.5 s latency each way.
  the_knob = knob("bits", 2, 1, 8, upload_bits=lambda v: 1000 * v + 64)
  common = {"down_bps": 1e6, "download_bits": 1_000_000, "latency_s": 0.5,
            "compute_seconds": 2.0}
  clients = [
      client("a", up_bps=1000, **common),   # 1.5 + 2 + (v + 0.064 + 0.5) <= 10: v <= 5.936 -> 5
      client("b", up_bps=2000, **common),   # 4.032 + v / 2 <= 10: v <= 11.9 -> max 8
      client("c", up_bps=100, **common),    # 4.64 + 10 v <= 10: v <= 0.536, none -> min 1
      client("d", up_bps=1000, **{**common, "compute_seconds": 4.5}),  # v <= 3.436 -> 3
  ]
  assert _decide(the_knob, clients, 10.0) == {"a": 5, "b": 8, "c": 1, "d": 3}


def test_a_round_time_equal_to_the_deadline_meets_it():
  the_knob = knob("bits", 2, 1, 8, upload_bits=lambda v: 1024 * v)
  clients = [client("a", up_bps=1024.0, down_bps=1.0)]  # round time = v seconds exactly
  assert _decide(the_knob, clients, 3.0) == {"a": 3}


def test_a_float_parameter_takes_its_largest_grid_point_within_the_deadline():
  # top-k fraction on 100,000 elements at 32 + 32 bits each: 6.4e6 * fraction bits.
  the_knob = knob("fraction", 0.01, 0.01, 0.1, integer=False, encoder="topk",
                  upload_bits=lambda f: round(6_400_000 * f))
  clients = [client("slow", up_bps=1e5, down_bps=1e9), client("fast", up_bps=1e6, down_bps=1e9)]
  # slow: 64 f <= 3 -> f <= 0.0469; fast: 6.4 f <= 3 -> f <= 0.469
  got = _decide(the_knob, clients, 3.0, steps=10)  # grid 0.01, 0.02, ..., 0.1
  assert got["slow"] == pytest.approx(0.04) and got["fast"] == pytest.approx(0.1)
  got = _decide(the_knob, clients, 3.0, values=[0.01, 0.025, 0.045, 0.05, 0.2])
  assert got == {"slow": 0.045, "fast": 0.05}  # 0.2 is outside [min, max]


def test_a_parameter_whose_bits_fall_as_it_grows_takes_the_most_bits_that_fit():
  # threshold's tau: the larger, the fewer values sent.
  the_knob = knob("tau", 1.0, 0.5, 4.0, integer=False, encoder="threshold",
                  upload_bits=lambda tau: round(8000 / tau))
  clients = [client("a", up_bps=1000.0, down_bps=1e9), client("b", up_bps=100.0, down_bps=1e9)]
  # a: 8 / tau <= 5 -> tau >= 1.6 -> 2.0 (the most bits that fit); b: 80 / tau <= 5 never -> 4.0
  assert _decide(the_knob, clients, 5.0, values=[0.5, 1.0, 2.0, 4.0]) == {"a": 2.0, "b": 4.0}


def test_a_wide_integer_range_sizes_few_values():
  asked = []

  def upload_bits(k):
    asked.append(k)
    return 64 * k

  the_knob = knob("k", 10, 1, 1_000_000, encoder="topk", upload_bits=upload_bits)
  clients = [client(str(i), up_bps=64.0 * (i + 1), down_bps=1e9) for i in range(20)]
  got = _decide(the_knob, clients, 100.0)  # k <= 100 (i + 1)
  assert got == {str(i): 100 * (i + 1) for i in range(20)}
  assert len(set(asked)) <= 2 + 20 * 20  # bisection: ~20 values per client, not a million


def test_an_integer_parameter_can_be_limited_to_a_few_values():
  asked = []

  def upload_bits(k):
    asked.append(k)
    return 64 * k

  the_knob = knob("k", 10, 1, 1_000_000, encoder="topk", upload_bits=upload_bits)
  clients = [client("a", up_bps=64.0, down_bps=1e9), client("b", up_bps=6400.0, down_bps=1e9)]
  # k <= 100 and k <= 10,000 (100 s)
  got = _decide(the_knob, clients, 100.0, values=[10, 100, 1000, 5000, 20000, 2e6])
  assert got == {"a": 100, "b": 5000} and all(type(v) is int for v in got.values())
  assert set(asked) <= {10, 100, 1000, 5000, 20000}
  with pytest.raises(UserError, match=r"values \[1.5, 3\] are not all integers \('k' is"):
    _decide(the_knob, clients, 100.0, values=[1.5, 3])


@pytest.mark.parametrize("clients, deadline_s, message", [
    ([client("a", up_bps=1e3, down_bps=1e3)], None, "needs system.deadline_seconds"),
    ([client("a")], 10.0, "needs system.profiles"),
])
def test_without_links_or_deadline_it_is_a_one_line_error(clients, deadline_s, message):
  with pytest.raises(UserError, match=f"controller 'link_budget' {message}"):
    _decide(knob(), clients, deadline_s)
