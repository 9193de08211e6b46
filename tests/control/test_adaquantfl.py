"""AdaQuantFL against a NumPy transcription of the paper's rule,
s_k = sqrt(F(w_0) / F(w_k)) s_0, rounded and bounded, in levels and in bits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedsim.control import CONTROLLERS
from fedsim.errors import UserError
from tests.control.views import knob, view

LOSSES = np.array([2.31, 1.90, 1.42, 0.97, 0.61, 0.38, 0.22, 0.09, 0.031, 0.004])


def _decisions(the_knob, losses) -> list:
  controller = CONTROLLERS.get("adaquantfl").build(None)
  state = controller.initial_state()
  out = []
  for r in range(1, len(losses) + 2):
    state, value = controller.decide(state, view(r, the_knob, losses[:r - 1]))
    out.append(value)
  return out


def _reference_levels(s0: float, losses) -> np.ndarray:
  """s_k for rounds 1..K+1: s_0 first (no loss yet), then the paper's rule on
  F(w_0) = losses[0] and F(w_k) = losses[k-1], rounded half up."""
  ratio = np.sqrt(losses[0] / np.asarray(losses))
  return np.concatenate([[s0], np.floor(ratio * s0 + 0.5)])


def test_levels_of_qsgd_follow_the_paper():
  got = _decisions(knob("levels", initial=3, minimum=1, maximum=40, encoder="qsgd"), LOSSES)
  want = np.clip(_reference_levels(3, LOSSES), 1, 40)
  np.testing.assert_array_equal(got, want)
  assert want[-1] == 40 and want[6] == 7  # the bound binds; round 7: sqrt(2.31 / 0.38) * 3 = 7.4 -> 7


def test_bits_hold_the_paper_levels():
  # b bits put 2**b points on the range: 2**b - 1 intervals = levels; initial 2 bits = 3 levels.
  got = _decisions(knob("bits", initial=2, minimum=1, maximum=6), LOSSES)
  levels = _reference_levels(2 ** 2 - 1, LOSSES)
  want = np.clip(np.ceil(np.log2(levels + 1)), 1, 6)
  np.testing.assert_array_equal(got, want)
  assert list(want[:4]) == [2, 2, 2, 3]  # s = 3, 3, 4 (3 * sqrt(2.31 / 1.42) = 3.83), 5
  assert all(type(v) is int for v in got)


def test_rounds_without_a_finite_loss_are_passed_over():
  controller = CONTROLLERS.get("adaquantfl").build(None)
  the_knob = knob("levels", initial=4, minimum=1, maximum=100, encoder="qsgd")
  # ... and a row read back from metrics.csv as text counts as its number.
  rows = ({"round": 1}, {"round": 2, "train/loss": 4.0}, {"round": 3, "train/loss": "1.0"},
          {"round": 4, "train/loss": float("nan")}, {"round": 5, "train/loss": ""})
  _, value = controller.decide({}, dataclasses.replace(view(6, the_knob), history=rows))
  assert value == 8  # sqrt(4 / 1) * 4


def test_a_parameter_that_is_not_a_level_count_is_refused_in_one_line():
  controller = CONTROLLERS.get("adaquantfl").build(None)
  with pytest.raises(UserError, match="controller 'adaquantfl' sets a number of quantization"
                                      " levels: it controls 'bits' or 'levels', not 'k'"):
    controller.decide({}, view(1, knob("k", 10, 1, 100, encoder="topk")))
