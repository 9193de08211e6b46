"""Simulated devices: who finishes a round, and when.

Each sampled client gets a completion time proportional to the examples it
processes, scaled by a seeded per-(round, client) speed factor; a client may
also fail to report at all (`dropout_probability`). With `backup_clients` B
over `clients_per_round` K, the first K reporting clients to finish are
aggregated and the rest are late: their updates are dropped (they received
the broadcast, but send nothing that counts). The round takes as long as the
K-th finisher (or the last reporting client when fewer report).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Mapping, Sequence

import numpy as np

from fedsim.config.typed import bounded
from fedsim.experiment.profiles import ProfilesConfig
from fedsim.registry import Registry

SYSTEM_STREAM = 7  # seed stream id (see fedsim/data/federated.py for the others)
SPEEDS = Registry("speed model")


@dataclasses.dataclass(frozen=True)
class SystemConfig:
  speed: str = "constant"                 # a SPEEDS entry: constant | lognormal
  sigma: float = bounded(0.5, min=0, used_with=("speed", "lognormal"))  # std-dev of log speed
  seconds_per_example: float = bounded(0.01, gt=0)
  dropout_probability: float = bounded(0.0, min=0, max=0.99)
  min_clients: int = bounded(1, min=1)    # fewer reports than this -> the round is skipped
  profiles: ProfilesConfig | None = None  # client devices and links (see profiles.py)

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


@dataclasses.dataclass(frozen=True)
class RoundOutcome:
  sampled: tuple[str, ...]
  aggregated: tuple[str, ...]   # in sampled order
  late: tuple[str, ...]
  failed: tuple[str, ...]
  completion_seconds: Mapping[str, float]
  round_seconds: float          # simulated duration of the round
  skipped: bool                 # fewer than min_clients reported


def simulate_round(config: SystemConfig, sampled: Sequence[str],
                   examples: Mapping[str, float], clients_per_round: int,
                   seed: int, round_num: int) -> RoundOutcome:
  """Decides which sampled clients count this round, from a seeded device model."""
  rng = np.random.default_rng([seed, SYSTEM_STREAM, round_num])
  n = len(sampled)
  slowdown = SPEEDS.get(config.speed).build(config, rng, n)
  fails = rng.random(n) < config.dropout_probability
  seconds = {cid: float(examples[cid] * config.seconds_per_example * slowdown[i])
             for i, cid in enumerate(sampled)}
  reporting = [cid for i, cid in enumerate(sampled) if not fails[i]]
  # Stable sort: ties keep sampled order, so the outcome is deterministic.
  finishers = sorted(reporting, key=lambda cid: seconds[cid])[:clients_per_round]
  chosen = set(finishers)
  skipped = len(finishers) < config.min_clients
  return RoundOutcome(
      sampled=tuple(sampled),
      aggregated=() if skipped else tuple(c for c in sampled if c in chosen),
      late=tuple(c for c in reporting if c not in chosen),
      failed=tuple(c for i, c in enumerate(sampled) if fails[i]),
      completion_seconds=seconds,
      round_seconds=max((seconds[c] for c in finishers), default=0.0),
      skipped=skipped)
