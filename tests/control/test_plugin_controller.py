"""A controller added by a plugin file registers, is listed by `fedsim list
controller`, and decides as its formula says; `clamp` keeps values in bounds."""

from __future__ import annotations

import math
import pathlib
import re
import sys

import pytest

from fedsim.control import CONTROLLERS, clamp
from tests.control.views import knob, view

PLUGIN = pathlib.Path(__file__).parents[1] / "plugins" / "toy_controller.py"


@pytest.fixture
def plugin():
  from fedsim.plugins import load_plugins
  load_plugins([PLUGIN.name], PLUGIN.parent)
  yield CONTROLLERS.get("loss_halving")
  CONTROLLERS._entries.pop("loss_halving", None)  # registries are process-wide
  for name in [m for m in sys.modules if "toy_controller" in m]:
    del sys.modules[name]


def test_the_plugin_controller_decides_one_bit_per_halving_of_the_loss(plugin):
  controller = plugin.build(plugin.params())
  the_knob = knob("bits", initial=2, minimum=1, maximum=6)
  # F_1 = 2.4; F_k = 2.4, 1.3 (< 1 halving), 1.2 (1), 0.5 (2: 2.4 / 0.5 = 4.8), 0.01 (7 -> max)
  losses = [2.4, 1.3, 1.2, 0.5, 0.01]
  got = [controller.decide({}, view(r, the_knob, losses[:r - 1]))[1] for r in range(1, 7)]
  assert got == [2, 2, 2, 3, 4, 6]
  halves = plugin.build(plugin.params(per_halving=0.5))
  assert halves.decide({}, view(5, the_knob, losses[:4]))[1] == 3  # 2 + 0.5 * 2


def test_the_plugin_controller_is_listed(plugin, capsys):
  from fedsim import cli
  assert cli.main(["list", "controller", "--plugin", str(PLUGIN)]) == 0
  out = capsys.readouterr().out
  # Columns align to the longest name listed (other tests may register longer ones).
  assert re.search(r"^controller loss_halving +per_halving: float = 1.0$", out, re.M)
  assert "One more bit (per_halving) each time the training loss halves" in out
  assert "controller adaquantfl" in out and "controller link_budget" in out


@pytest.mark.parametrize("value, the_knob, want", [
    (2.5, knob(minimum=1, maximum=8), 3),          # half up, not to even
    (3.49, knob(minimum=1, maximum=8), 3),
    (11.0, knob(minimum=1, maximum=8), 8),
    (-math.inf, knob(minimum=1, maximum=8), 1),
    (0.05, knob("fraction", 0.1, 0.1, 0.5, integer=False), 0.1),
    (0.25, knob("fraction", 0.1, 0.1, 0.5, integer=False), 0.25),
])
def test_clamp(value, the_knob, want):
  got = clamp(value, the_knob)
  assert got == want and type(got) is type(want)
