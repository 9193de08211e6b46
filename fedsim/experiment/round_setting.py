"""What each sampled client of a synchronous round runs: its round and its wire bits.

Without a controller every client runs the run's round at the configured
sizes: the one-value case. With a controlled encoder parameter
(`fedsim.control.engine`), the controller first decides each client's value
from what the server knows before the round (a `fedsim.control.ServerView`:
the metrics so far, the sampled clients' examples and, with
`system.profiles`, their links), and each client runs and is sized at its
value's variant.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from fedsim.control import ClientView, ServerView
from fedsim.control.engine import control_metrics
from fedsim.system.profiles import profile_source, round_links
from fedsim.sizing import ClientWireBits


@dataclasses.dataclass(frozen=True)
class RoundSetting:
  """The value each sampled client runs (None: the run's own round), and what it costs."""

  sim: Any
  values: Mapping[str, float | None]      # client id -> its value, in sampling order
  wire: Mapping[str, ClientWireBits]      # client id -> its value's bits per round
  control_state: dict | None              # the controller's new state, None without one

  def process(self, value: float | None):
    """The round that clients of `value` run (a variant is compiled on first use)."""
    return self.sim.round_process if value is None else self.sim.control.variant(value).process

  def metrics(self, clients: Sequence[str]) -> dict[str, float]:
    """`control/<param>_*` over `clients`' values; {} without a controller."""
    if self.sim.control is None:
      return {}
    return control_metrics(self.sim.control.controlled.spec.param,
                           [self.values[c] for c in clients])

  def client_values(self, clients: Sequence[str]) -> tuple | None:
    """(each client's value, its upload's static bits) with a controller, else None."""
    if self.sim.control is None:
      return None
    return (tuple(self.values[c] for c in clients),
            tuple(self.wire[c].aggregate for c in clients))


def round_setting(sim, round_num: int, history: Sequence[Mapping[str, float]],
                  control_state: dict | None, sampled: Sequence[str],
                  examples: Mapping[str, float]) -> RoundSetting:
  """What each of `sampled` runs in round `round_num`.

  Raises:
    UserError: the controller's decision is refused (see `RoundControl.decide`),
      or a variant cannot be built.
  """
  if sim.control is None:
    return RoundSetting(sim, {cid: None for cid in sampled}, {cid: sim.wire for cid in sampled},
                        None)
  view = server_view(sim, round_num, history, sampled, examples)
  control_state, values = sim.control.decide(control_state, view)
  return RoundSetting(sim, values, {cid: sim.control.variant(v).wire for cid, v in values.items()},
                      control_state)


def server_view(sim, round_num: int, history: Sequence[Mapping[str, float]],
                sampled: Sequence[str], examples: Mapping[str, float]) -> ServerView:
  """The `fedsim.control.ServerView` of round `round_num`, before it runs."""
  return ServerView(round=round_num, history=tuple(history),
                    clients=client_views(sim, sampled, examples, round_num, sim.wire.broadcast),
                    deadline_s=sim.config.system.deadline_seconds, knob=sim.control.knob())


def client_views(sim, sampled: Sequence[str], examples: Mapping[str, float], round_num: int,
                 download_bits: int) -> tuple:
  """What the server knows of each sampled client before the round (`fedsim.control.ClientView`):
  its examples, and with `system.profiles` its links this round and nominal
  compute time (without the round's random slowdown, which it cannot know)."""
  system, seed = sim.config.system, sim.config.seed
  profile_of = (profile_source(system.profiles, seed, sim.data.client_ids)
                if system.profiles is not None else None)
  views = []
  for cid in sampled:
    compute = examples[cid] * system.seconds_per_example
    if profile_of is None:
      views.append(ClientView(id=cid, examples=int(examples[cid]), up_bps=None, down_bps=None,
                              latency_s=0.0, compute_seconds=float(compute),
                              download_bits=int(download_bits)))
      continue
    profile = profile_of(cid)
    links = round_links(system.profiles, profile, seed, round_num, cid)
    views.append(ClientView(id=cid, examples=int(examples[cid]), up_bps=float(links.up_bps),
                            down_bps=float(links.down_bps), latency_s=float(profile.latency_s),
                            compute_seconds=float(compute / profile.compute_speed),
                            download_bits=int(download_bits)))
  return tuple(views)
