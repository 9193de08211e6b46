"""DAdaQuant (Hönig, Zhao, Mullins, ICML 2022, "DAdaQuant: Doubly-adaptive quantization for
communication-efficient federated learning"), section 3.4-3.6.

Time-adaptive (3.4): q starts at the initial value (q_min). The training
loss of the sampled clients, G_t, is smoothed as GG_t = psi GG_{t-1} + (1 - psi) G_t
(GG_1 = G_1; psi = `smoothing`, 0.9 in the paper). Training has converged
when the smoothed loss rose across phi rounds (phi = `patience`), GG_t >
GG_{t+1-phi}; q then doubles, up to the knob's max (q_max), and is held for
at least phi rounds. The paper writes >=; its authors' code (a Flower
strategy, `mov_avg_losses[-1] - mov_avg_losses[-block_length] > 0`) tests >,
as here, so phi = 1 never doubles. The paper sets phi to a tenth of the
rounds. Like that code, fedsim decides a round's q before it runs, from the
rounds before: G_t is a row's "train/loss".

Client-adaptive (3.5, Theorem 1): sampled client i, of weight
w_i = n_i / sum_j n_j (its examples), gets

    q_i = max(1, round( sqrt(a / b) w_i^(2/3) )),   a = sum_j w_j^(2/3),   b = sum_j w_j^2 / q^2,

the levels that minimise the communication budget sum_i q_i (the paper
finds communication roughly linear in q for Elias-coded QSGD) subject to the
expected quantization variance, (t^2 / 6) sum_i w_i^2 / q_i^2 (Lemma 3), being
that of every client at q. `equal: communication` is Lemma 4 instead: the
budget sum_i q_i = K q kept, the variance minimised, q_i = K q w_i^(2/3) / a.
`fedsim.control.levels` maps levels to `bits` or qsgd's `levels`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, Sequence

from fedsim.config.typed import bounded
from fedsim.control import ServerView, metric, register_controller
from fedsim.control.levels import from_levels, require_levels, to_levels
from fedsim.metric_names import ROUND, TRAIN_LOSS


@dataclasses.dataclass(frozen=True)
class DAdaQuantParams:
  patience: int = bounded(10, min=1)     # phi: rounds compared, and held at a level
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
  state = {**state, "smoothed": list(state["smoothed"])}
  phi = params.patience
  for position, row in enumerate(history, start=1):
    round_num = int(metric(row, ROUND) or position)
    if round_num <= state["last_round"]:
      continue
    state["last_round"] = round_num
    loss = metric(row, TRAIN_LOSS)
    if loss is None:
      continue  # a skipped round says nothing about the loss
    window = state["smoothed"]
    psi = params.smoothing
    window.append(loss if not window else psi * window[-1] + (1 - psi) * loss)
    del window[:-phi]  # GG_{t+1-phi} .. GG_t
    state["held"] += 1
    if state["held"] >= phi and len(window) == phi and window[-1] > window[0]:
      state["levels"], state["held"] = min(2 * state["levels"], max_levels), 0
  return state


@dataclasses.dataclass(frozen=True)
class DAdaQuant:
  params: DAdaQuantParams

  def initial_state(self) -> dict:
    # `levels` is set from the knob's initial value at the first decision.
    return {"levels": None, "smoothed": [], "held": 0, "last_round": 0}

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
  """DAdaQuant (Hönig et al. 2022): levels double when the smoothed loss stalls; per client, q_i ~ w_i^(2/3)."""
  return DAdaQuant(params)
