"""Simulated devices and links: who finishes a round, and when.

A sampled client's round takes download + compute + upload seconds:

  download = broadcast bits / down_bps + latency_s
  compute  = examples x seconds_per_example x slowdown / compute_speed
  upload   = aggregate bits / up_bps + latency_s

The bits are those the run's algorithm actually sends per client (so
compression shortens rounds on slow links); the slowdown is a seeded
per-(round, client) factor (`speed`); compute speed, bandwidths, latency
and availability come from the client's persistent profile
(`system.profiles`, see `profiles.py`). Without profiles the links are
infinitely fast and every client is available: only compute counts. A client may also fail to report at all
(`dropout_probability`, or offline by its availability).

With `backup_clients` B over `clients_per_round` K, the first K reporting
clients to finish (by `deadline_seconds`, if set) are aggregated and the rest
are late: their updates are dropped. The round takes as long as the K-th
finisher; with a deadline and fewer than K finishers it lasts the deadline
(the server cannot know who will never report), without one it ends with the
last reporting client. `late_uploads` says whether late clients' uploads
cross the wire anyway (`sent`) or are aborted (no bits).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Mapping, Sequence

import numpy as np

from fedsim.config.typed import bounded
from fedsim.system.profiles import ProfilesConfig, profile_source, round_links
from fedsim.registry import Registry
from fedsim.seeds import SYSTEM_STREAM

SPEEDS = Registry("speed model")


@dataclasses.dataclass(frozen=True)
class SystemConfig:
  speed: str = "constant"                 # a SPEEDS entry: constant | lognormal
  sigma: float = bounded(0.5, min=0, used_with=("speed", "lognormal"))  # std-dev of log speed
  seconds_per_example: float = bounded(0.01, gt=0)
  dropout_probability: float = bounded(0.0, min=0, max=0.99)
  min_clients: int = bounded(1, min=1)    # fewer reports than this -> the round is skipped
  profiles: ProfilesConfig | None = None  # client devices and links; none: compute time only
  deadline_seconds: float | None = bounded(None, gt=0)  # later finishers are dropped
  late_uploads: Literal["aborted", "sent"] = "aborted"  # do late clients' uploads count in bits

  def check(self, key: str) -> None:
    SPEEDS.get(self.speed, f"{key}.speed" if key else "system.speed")


@SPEEDS.register("constant")
def constant_speed(config: SystemConfig, rng: np.random.Generator, n: int) -> np.ndarray:
  """Every device equally fast."""
  del config, rng
  return np.ones(n)


@SPEEDS.register("lognormal")
def lognormal_speed(config: SystemConfig, rng: np.random.Generator, n: int) -> np.ndarray:
  """Slowdown factors exp(sigma * z), z ~ N(0, 1): a heavy tail of stragglers."""
  return np.exp(config.sigma * rng.standard_normal(n))


class _SeededOnUse:
  """`np.random.default_rng(seed)`, made at its first use: a round with constant
  speeds and no dropout draws nothing, and seeding a generator costs ~0.1 ms of
  a W2 round's loop."""

  def __init__(self, seed: Sequence[int]):
    self._seed = seed
    self._rng: np.random.Generator | None = None

  def __getattr__(self, name: str):
    if self._rng is None:
      self._rng = np.random.default_rng(self._seed)
    return getattr(self._rng, name)


@dataclasses.dataclass(frozen=True)
class RoundOutcome:
  sampled: tuple[str, ...]
  aggregated: tuple[str, ...]   # in sampled order
  late: tuple[str, ...]
  failed: tuple[str, ...]       # dropped out or offline: received the broadcast, sent nothing
  completion_seconds: Mapping[str, float]  # download + compute + upload, per client
  round_seconds: float          # simulated duration of the round
  skipped: bool                 # fewer than min_clients reported
  uploaded: tuple[str, ...] = ()  # whose upload crossed the wire (aggregated, + late if sent)


def simulate_round(config: SystemConfig, sampled: Sequence[str],
                   examples: Mapping[str, float], clients_per_round: int,
                   seed: int, round_num: int,
                   wire_bits: tuple[int, int | Mapping[str, int]] = (0, 0),
                   population: Sequence[str] = ()) -> RoundOutcome:
  """Decides which sampled clients count this round, from a seeded device model.

  Args:
    examples: per client, the examples it processes this round.
    wire_bits: (broadcast, aggregate) bits per client per round; only used
      with `config.profiles`. `aggregate` may be a mapping from client id to
      its own upload's bits (encoder parameters set per client).
    population: every client of the data; a profile trace must list exactly these.

  Raises:
    UserError: a profile trace does not match `population`.
  """
  rng = _SeededOnUse([seed, SYSTEM_STREAM, round_num])
  n = len(sampled)
  slowdown = SPEEDS.get(config.speed).build(config, rng, n)
  # Drawn only when a client may drop out: `random(n) < 0` is all False.
  fails = (rng.random(n) < config.dropout_probability if config.dropout_probability
           else np.zeros(n, bool))
  seconds = {}
  profile_of = (profile_source(config.profiles, seed, population)
                if config.profiles is not None else None)
  for i, cid in enumerate(sampled):
    compute = examples[cid] * config.seconds_per_example * slowdown[i]
    if profile_of is None:
      seconds[cid] = float(compute)
      continue
    profile = profile_of(cid)
    links = round_links(config.profiles, profile, seed, round_num, cid)
    fails[i] |= not links.online
    download = wire_bits[0] / links.down_bps + profile.latency_s
    sent = wire_bits[1][cid] if isinstance(wire_bits[1], Mapping) else wire_bits[1]
    upload = sent / links.up_bps + profile.latency_s
    seconds[cid] = float(download + compute / profile.compute_speed + upload)
  reporting = [cid for i, cid in enumerate(sampled) if not fails[i]]
  deadline = config.deadline_seconds
  # Stable sort: ties keep sampled order, so the outcome is deterministic.
  finishers = [cid for cid in sorted(reporting, key=lambda cid: seconds[cid])
               if deadline is None or seconds[cid] <= deadline][:clients_per_round]
  chosen = set(finishers)
  skipped = len(finishers) < config.min_clients
  aggregated = () if skipped else tuple(c for c in sampled if c in chosen)
  if deadline is not None and len(finishers) < clients_per_round:
    round_seconds = deadline
  else:
    round_seconds = max((seconds[c] for c in finishers), default=0.0)
  return RoundOutcome(
      sampled=tuple(sampled),
      aggregated=aggregated,
      late=tuple(c for c in reporting if c not in chosen),
      failed=tuple(c for i, c in enumerate(sampled) if fails[i]),
      completion_seconds=seconds,
      round_seconds=round_seconds,
      skipped=skipped,
      uploaded=tuple(reporting) if config.late_uploads == "sent" else aggregated)
