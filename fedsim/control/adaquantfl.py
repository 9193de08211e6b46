"""AdaQuantFL (Jhunjhunwala, Gadhikar, Joshi, Eldar, ICASSP 2021, "Adaptive quantization of
model updates for communication-efficient federated learning").

    s_k = round( sqrt( F(w_0) / F(w_k) ) * s_0 )

s is the number of quantization levels (see `fedsim.control.levels` for how
it maps to `bits` or qsgd's `levels`): as the training loss F falls, the
levels grow. F(w_0) is the training loss of the first metrics row (round 1's
clients trained from w_0), F(w_k) that of the newest; rounds without a finite
"train/loss" are passed over. Round 1 (no row yet) uses the initial value.
One value per round, the same for every client.

s moves in whole levels (`levels.from_levels` rounds it half up), so a small
s_0 moves late: from 1 bit (s_0 = 1) the second bit needs s = 2, a loss at
4/9 of F(w_0) or lower; until then every upload keeps 1 bit.
"""

from __future__ import annotations

import dataclasses
import math

from fedsim.control import ServerView, earliest, latest, register_controller
from fedsim.control.levels import from_levels, require_levels, to_levels
from fedsim.metric_names import TRAIN_LOSS
from fedsim.registry import NoParams


@dataclasses.dataclass(frozen=True)
class AdaQuantFL:
  def initial_state(self) -> dict:
    return {}

  def decide(self, state: dict, view: ServerView):
    knob = view.knob
    require_levels(knob, "adaquantfl")
    s0 = to_levels(knob.initial, knob)
    first, now = earliest(view.history, TRAIN_LOSS), latest(view.history, TRAIN_LOSS)
    if first is None or now is None:
      return {}, from_levels(s0, knob)
    if now <= 0.0:  # a loss of zero asks for infinitely many levels
      return {}, from_levels(math.inf, knob)
    return {}, from_levels(math.sqrt(first / now) * s0, knob)


@register_controller("adaquantfl", params=NoParams)
def build_adaquantfl(params: NoParams) -> AdaQuantFL:
  """AdaQuantFL (Jhunjhunwala et al. 2021): one level count per round, s = sqrt(F(w_0) / F(w_k)) s_0, grows as the training loss falls."""
  del params
  return AdaQuantFL()
