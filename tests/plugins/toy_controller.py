"""A controller plugin, one file: one more bit each time the training loss halves.

    bits_k = initial + per_halving * floor(log2(F_1 / F_k))

F_1 is round 1's training loss ("train/loss" of the first metrics row), F_k
the newest; round 1 runs at `initial`. metrics.csv has no update norm (only
error feedback's residual norm, with error feedback on), so the loss is the
signal. Named in a config after `plugins: [toy_controller.py]`:

    aggregation:
      - {name: encode, encoder: uniform, bits: {controller: loss_halving, initial: 2, max: 8}}
"""

from __future__ import annotations

import dataclasses
import math

from fedsim.config.typed import bounded
from fedsim.control import ServerView, clamp, earliest, latest, register_controller
from fedsim.metric_names import TRAIN_LOSS


@dataclasses.dataclass(frozen=True)
class HalvingParams:
  per_halving: float = bounded(1.0, gt=0.0)  # added to the value each time the loss halves


@dataclasses.dataclass(frozen=True)
class LossHalving:
  params: HalvingParams

  def initial_state(self) -> dict:
    return {}  # the value is a function of the history alone

  def decide(self, state: dict, view: ServerView):
    knob = view.knob
    first, now = earliest(view.history, TRAIN_LOSS), latest(view.history, TRAIN_LOSS)
    if first is None or now is None or first <= 0 or now <= 0:
      return {}, clamp(knob.initial, knob)
    halvings = math.floor(math.log2(first / now))
    return {}, clamp(knob.initial + self.params.per_halving * halvings, knob)


@register_controller("loss_halving", params=HalvingParams)
def build_loss_halving(params: HalvingParams) -> LossHalving:
  """One more bit (per_halving) each time the training loss halves (a plugin controller)."""
  return LossHalving(params)
