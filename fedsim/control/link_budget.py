"""`link_budget`: each client gets the value that sends the most it can within the deadline.

A sampled client's round takes, as the simulated clock counts it
(`fedsim.system.clock.simulate_round`),

    (download_bits / down_bps + latency_s) + compute_seconds + (upload_bits(v) / up_bps + latency_s)

Among the candidate values (the `values` given; else every integer in
[min, max] for an integer parameter, `steps` evenly spaced points for a
float one), the client gets the one with the most upload bits whose round time is
<= system.deadline_seconds (the largest such value, for parameters whose
bits grow with the value: bits, levels, k, fraction), and the one with the
fewest bits when none is: slow links send less instead of arriving late.
Candidates are searched by bisection, assuming bits monotone in the value,
so a round sizes O(log(candidates)) values per client, not all of them. Each
value sized is a round compiled (and cached) by the engine: for a wide range
(topk's k) a short `values` list keeps that to a few.
"""

from __future__ import annotations

import dataclasses
import math

from fedsim.config.typed import bounded
from fedsim.control import ClientView, Knob, ServerView, register_controller
from fedsim.errors import UserError


@dataclasses.dataclass(frozen=True)
class LinkBudgetParams:
  values: list[float] | None = None   # the candidates (default: every integer, or `steps` points)
  steps: int = bounded(16, min=2)      # a float parameter's candidates without `values`


def round_seconds(client: ClientView, upload_bits: int) -> float:
  """The client's round time at `upload_bits`, in the clock's order of operations."""
  download = client.download_bits / client.down_bps + client.latency_s
  upload = upload_bits / client.up_bps + client.latency_s
  return download + client.compute_seconds + upload


def candidates(knob: Knob, params: LinkBudgetParams) -> list[float]:
  """The values a client may get, increasing.

  Raises:
    UserError: `values` has none within [min, max], or a fraction for an integer parameter.
  """
  if params.values is not None:
    inside = sorted({float(v) for v in params.values if knob.minimum <= v <= knob.maximum})
    if not inside:
      raise UserError(f"controller 'link_budget': values {params.values} has none within"
                      f" [{knob.minimum}, {knob.maximum}]")
    if knob.integer:
      if any(not v.is_integer() for v in inside):
        raise UserError(f"controller 'link_budget': values {params.values} are not all"
                        f" integers ('{knob.param}' is an integer)")
      return [int(v) for v in inside]
    return inside
  if knob.integer:
    return list(range(math.ceil(knob.minimum), math.floor(knob.maximum) + 1))
  step = (knob.maximum - knob.minimum) / (params.steps - 1)
  return [knob.minimum + i * step for i in range(params.steps - 1)] + [float(knob.maximum)]


@dataclasses.dataclass(frozen=True)
class LinkBudget:
  params: LinkBudgetParams

  def initial_state(self) -> dict:
    return {}

  def decide(self, state: dict, view: ServerView):
    if view.deadline_s is None:
      raise UserError("controller 'link_budget' needs system.deadline_seconds (the round"
                      " time each client's upload must fit in)")
    if any(c.up_bps is None or c.down_bps is None for c in view.clients):
      raise UserError("controller 'link_budget' needs system.profiles (each client's links)")
    knob = view.knob
    values = candidates(knob, self.params)
    sizes: dict[int, int] = {}

    def bits(i: int) -> int:
      if i not in sizes:
        sizes[i] = knob.upload_bits(values[i])
      return sizes[i]

    # Order the candidates from fewest to most bits (threshold's tau sends less as it grows).
    order = list(range(len(values)))
    if bits(order[-1]) < bits(order[0]):
      order.reverse()
    decision = {}
    for client in view.clients:
      if round_seconds(client, bits(order[0])) > view.deadline_s:
        decision[client.id] = values[order[0]]
        continue
      low, high = 0, len(order) - 1  # order[low] fits; find the last that does
      while low < high:
        mid = (low + high + 1) // 2
        if round_seconds(client, bits(order[mid])) <= view.deadline_s:
          low = mid
        else:
          high = mid - 1
      decision[client.id] = values[order[low]]
    return {}, decision


@register_controller("link_budget", params=LinkBudgetParams)
def build_link_budget(params: LinkBudgetParams) -> LinkBudget:
  """Per client, the value with the most upload bits whose round time meets system.deadline_seconds."""
  return LinkBudget(params)
