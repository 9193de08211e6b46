"""`schedule`: the parameter as a fixed function of the round.

    piecewise:    v(r) = values[i] for rounds[i] <= r < rounds[i + 1]  (initial before rounds[0])
    linear:       v(r) = start + (end - start) * min(r - 1, over) / over
    exponential:  v(r) = start * factor ** floor((r - 1) / every)

`start` defaults to the knob's `initial`. Values are rounded half up for an
integer parameter and kept within [min, max].
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from fedsim.config.typed import bounded
from fedsim.control import Knob, ServerView, clamp, register_controller
from fedsim.errors import UserError


@dataclasses.dataclass(frozen=True)
class ScheduleParams:
  kind: Literal["piecewise", "linear", "exponential"] = "piecewise"
  values: list[float] | None = bounded(None, used_with=("kind", "piecewise"))
  rounds: list[int] | None = bounded(None, used_with=("kind", "piecewise"))
  start: float | None = bounded(None, used_with=("kind", "linear", "exponential"))
  end: float | None = bounded(None, used_with=("kind", "linear"))
  over: int | None = bounded(None, min=1, used_with=("kind", "linear"))
  factor: float | None = bounded(None, gt=0.0, used_with=("kind", "exponential"))
  every: int = bounded(1, min=1, used_with=("kind", "exponential"))

  def check(self, key: str) -> None:
    needs = {"piecewise": ("values", "rounds"), "linear": ("end", "over"),
             "exponential": ("factor",)}[self.kind]
    for name in needs:
      if getattr(self, name) is None:
        raise UserError(f"{key}.{name}: required with kind: {self.kind}")
    if self.kind == "piecewise":
      if len(self.values) != len(self.rounds) or not self.values:
        raise UserError(f"{key}.rounds: one round per value ({len(self.rounds)} rounds,"
                        f" {len(self.values)} values)")
      if self.rounds[0] < 1 or any(b <= a for a, b in zip(self.rounds, self.rounds[1:])):
        raise UserError(f"{key}.rounds: must increase from 1 or later, got {self.rounds}")


def scheduled(params: ScheduleParams, round_num: int, initial: float) -> float:
  """The schedule's value at `round_num` (1-based), before rounding and bounds."""
  if params.kind == "piecewise":
    value = initial
    for first, v in zip(params.rounds, params.values):
      if round_num >= first:
        value = v
    return value
  start = initial if params.start is None else params.start
  if params.kind == "linear":
    return start + (params.end - start) * min(round_num - 1, params.over) / params.over
  try:
    return start * params.factor ** ((round_num - 1) // params.every)
  except OverflowError:  # far past max: clamp takes it to the bound
    return math.copysign(math.inf, start)


@dataclasses.dataclass(frozen=True)
class Schedule:
  params: ScheduleParams

  def initial_state(self) -> dict:
    return {}

  def decide(self, state: dict, view: ServerView):
    knob: Knob = view.knob
    return {}, clamp(scheduled(self.params, view.round, knob.initial), knob)


@register_controller("schedule", params=ScheduleParams)
def build_schedule(params: ScheduleParams) -> Schedule:
  """A fixed function of the round: piecewise, linear or exponential."""
  return Schedule(params)
