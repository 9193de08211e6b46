"""`schedule` against values written out by hand from its three formulas."""

from __future__ import annotations

import pytest

from fedsim.config.typed import parse
from fedsim.control import CONTROLLERS
from fedsim.errors import UserError
from tests.control.views import knob, view


def _run(params: dict, the_knob, rounds: int) -> list:
  entry = CONTROLLERS.get("schedule")
  controller = entry.build(parse(entry.params, params, "bits"))
  state = controller.initial_state()
  values = []
  for r in range(1, rounds + 1):
    state, value = controller.decide(state, view(r, the_knob))
    values.append(value)
  return values


@pytest.mark.parametrize("params, the_knob, want", [
    # v_i from round r_i on; the initial value (2) before the first
    ({"values": [3, 5, 8], "rounds": [2, 4, 7]}, knob(initial=2),
     [2, 3, 3, 5, 5, 5, 8, 8]),
    # 2 -> 8 over 6 rounds, then flat
    ({"kind": "linear", "end": 8, "over": 6}, knob(initial=2), [2, 3, 4, 5, 6, 7, 8, 8, 8]),
    # 2 -> 3 over 2 rounds: round 2 is 2.5, rounded half up to 3
    ({"kind": "linear", "start": 2, "end": 3, "over": 2}, knob(), [2, 3, 3]),
    # a float knob is not rounded: 0.1 -> 0.5 over 4 rounds
    ({"kind": "linear", "start": 0.1, "end": 0.5, "over": 4},
     knob("fraction", 0.1, 0.01, 1.0, integer=False), [0.1, 0.2, 0.3, 0.4, 0.5, 0.5]),
    # 1, doubling every 2 rounds, capped at max 6
    ({"kind": "exponential", "start": 1, "factor": 2, "every": 2}, knob(maximum=6),
     [1, 1, 2, 2, 4, 4, 6, 6]),
    # halving from the initial 16 each round, floored at min 3 (16, 8, 4, 2 -> 3)
    ({"kind": "exponential", "factor": 0.5}, knob("levels", 16, 3, 100), [16, 8, 4, 3, 3]),
])
def test_schedule_values_by_round(params, the_knob, want):
  assert _run(params, the_knob, len(want)) == pytest.approx(want, abs=1e-12)


def test_integer_values_are_ints_and_a_huge_exponential_stays_at_max():
  values = _run({"kind": "exponential", "start": 2, "factor": 1e6}, knob(maximum=8), 400)
  assert values[:2] == [2, 8] and set(values[1:]) == {8}
  assert all(type(v) is int for v in values)


@pytest.mark.parametrize("params, message", [
    ({"values": [2, 4]}, "bits.rounds: required with kind: piecewise"),
    ({"values": [2, 4], "rounds": [1]}, "bits.rounds: one round per value"),
    ({"values": [2, 4], "rounds": [3, 3]}, "bits.rounds: must increase from 1 or later"),
    ({"values": [2], "rounds": [0]}, "bits.rounds: must increase from 1 or later"),
    ({"kind": "linear", "end": 4}, "bits.over: required with kind: linear"),
    ({"kind": "exponential"}, "bits.factor: required with kind: exponential"),
    ({"kind": "linear", "end": 4, "over": 2, "factor": 2},
     "bits.factor: only used with kind: exponential"),
    ({"kind": "exponential", "factor": 0}, "bits.factor: must be > 0.0"),
])
def test_bad_schedules_are_one_line_errors_naming_the_key(params, message):
  entry = CONTROLLERS.get("schedule")
  with pytest.raises(UserError, match=message.replace(".", r"\.").replace("(", r"\(")):
    parse(entry.params, params, "bits")
