"""DAdaQuant (Hönig, Zhao, Mullins, ICML 2022, "DAdaQuant: Doubly-adaptive quantization for
communication-efficient federated learning").

Time-adaptive: the level count q starts at the initial value and doubles
whenever the smoothed training loss, F^_t = psi F^_{t-1} + (1 - psi) F_t
(F^_1 = F_1, psi = `smoothing`), has made no new minimum for `patience`
rounds; it is smoothed because the loss comes from the round's sampled clients only.

Client-adaptive: sampled client k, of weight w_k = n_k / sum_j n_j (its
examples), gets

    q_k = sqrt(a / b) w_k^(2/3),   a = sum_j w_j^(2/3),   b = sum_j w_j^2 / q^2,

which minimises the paper's communication model (linear in q_k, as for
Elias-coded QSGD) at the variance of every client quantized with q (the
weighted sum's variance modelled as sum_k w_k^2 / q_k^2). With `equal:
communication` it keeps sum_k q_k = K q and minimises the variance instead:
q_k = K q w_k^(2/3) / a. Both are rounded to integers; `fedsim.control.levels`
maps levels to `bits` or qsgd's `levels`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, Sequence

from fedsim.config.typed import bounded
from fedsim.control import ServerView, register_controller
from fedsim.control.levels import from_levels, require_levels, to_levels
from fedsim.metric_names import ROUND, TRAIN_LOSS


@dataclasses.dataclass(frozen=True)
class DAdaQuantParams:
  patience: int = bounded(3, min=1)          # rounds without a new minimum before q doubles
  smoothing: float = bounded(0.9, min=0.0, max=0.999)  # psi of the loss's moving average
  client_adaptive: bool = True
  equal: Literal["variance", "communication"] = "variance"


def client_levels(q: float, weights: Sequence[float], equal: str = "variance") -> list[float]:
  """DAdaQuant's per-client level counts (unrounded) for level `q` and client
  weights summing to 1: proportional to w_k^(2/3), at the variance (`equal:
  variance`) or the summed levels (`communication`) of every client at q."""
  a = sum(w ** (2 / 3) for w in weights)
  if equal == "communication":
    return [len(weights) * q * w ** (2 / 3) / a for w in weights]
  b = sum(w * w for w in weights) / (q * q)
  return [math.sqrt(a / b) * w ** (2 / 3) for w in weights]


def _smooth(state: dict, history, params: DAdaQuantParams, max_levels: float) -> dict:
  """`state` after the metrics rows it has not seen yet (by round number)."""
  state = dict(state)
  for position, row in enumerate(history, start=1):
    round_num = int(row.get(ROUND, position))
    if round_num <= state["last_round"]:
      continue
    state["last_round"] = round_num
    loss = row.get(TRAIN_LOSS)
    if loss is None or not math.isfinite(loss):
      continue  # a skipped round says nothing about the loss
    smoothed = state["smoothed"]
    smoothed = loss if smoothed is None else params.smoothing * smoothed + (1 - params.smoothing) * loss
    state["smoothed"] = smoothed
    if state["best"] is None or smoothed < state["best"]:
      state["best"], state["stale"] = smoothed, 0
      continue
    state["stale"] += 1
    if state["stale"] >= params.patience:
      state["levels"], state["stale"] = min(2 * state["levels"], max_levels), 0
  return state


@dataclasses.dataclass(frozen=True)
class DAdaQuant:
  params: DAdaQuantParams

  def initial_state(self) -> dict:
    # `levels` is set from the knob's initial value at the first decision.
    return {"levels": None, "smoothed": None, "best": None, "stale": 0, "last_round": 0}

  def decide(self, state: dict, view: ServerView):
    knob = view.knob
    require_levels(knob, "dadaquant")
    if state["levels"] is None:
      state = {**state, "levels": to_levels(knob.initial, knob)}
    state = _smooth(state, view.history, self.params, to_levels(knob.maximum, knob))
    q = state["levels"]
    if not self.params.client_adaptive or not view.clients:
      return state, from_levels(q, knob)
    total = sum(c.examples for c in view.clients)
    weights = ([c.examples / total for c in view.clients] if total > 0
               else [1 / len(view.clients)] * len(view.clients))
    levels = client_levels(q, weights, self.params.equal)
    return state, {c.id: from_levels(s, knob) for c, s in zip(view.clients, levels)}


@register_controller("dadaquant", params=DAdaQuantParams)
def build_dadaquant(params: DAdaQuantParams) -> DAdaQuant:
  """DAdaQuant (Hönig et al. 2022): levels double when the smoothed loss stalls; per client, q_k ~ w_k^(2/3)."""
  return DAdaQuant(params)
