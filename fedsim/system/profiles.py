"""Client device and link profiles that persist across rounds.

A client's profile is its compute speed (a multiple of the nominal rate
`system.seconds_per_example`), downlink and uplink bandwidth (bits/s), latency
(seconds, paid once per direction) and availability (the probability that it
is online when sampled). Profiles are drawn once per client, a pure function
of (run seed, client id), so a client is the same device in every round and
in a resumed run; or they are read from a CSV trace. With `jitter` > 0 a
round scales each client's two bandwidths by exp(jitter * z), z ~ N(0, 1)
seeded by (seed, round, client).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import os
from typing import Callable, Literal, Mapping, Sequence

import numpy as np

from fedsim.config.typed import bounded
from fedsim.errors import UserError
from fedsim.seeds import JITTER_STREAM, PROFILE_STREAM

TRACE_COLUMNS = ("client_id", "compute_speed", "down_bps", "up_bps", "latency_s", "availability")


@dataclasses.dataclass(frozen=True)
class LogNormal:
  """A quantity drawn once per client: median x exp(sigma z), z ~ N(0, 1)."""

  median: float = bounded(1.0, min=0)
  sigma: float = bounded(0.0, min=0)  # 0: every client gets the median

  def draw(self, z: float) -> float:
    return float(self.median * np.exp(self.sigma * z))


@dataclasses.dataclass(frozen=True)
class Uniform:
  """A quantity drawn once per client, uniform between low and high."""

  low: float = bounded(1.0, min=0, max=1)
  high: float = bounded(1.0, min=0, max=1)

  def check(self, key: str) -> None:
    if self.low > self.high:
      raise UserError(f"{key}.low: {self.low} is larger than high ({self.high})")


_SAMPLED = ("source", "sampled")


@dataclasses.dataclass(frozen=True)
class ProfilesConfig:
  """`system.profiles`: where client profiles come from."""

  source: Literal["sampled", "trace"] = "sampled"
  trace: str | None = bounded(None, used_with=("source", "trace"))  # CSV file, see TRACE_COLUMNS
  compute_speed: LogNormal = bounded(LogNormal(1.0, 0.0), used_with=_SAMPLED)
  down_bps: LogNormal = bounded(LogNormal(20e6, 0.0), used_with=_SAMPLED)  # bits/s
  up_bps: LogNormal = bounded(LogNormal(5e6, 0.0), used_with=_SAMPLED)     # bits/s
  latency_s: LogNormal = bounded(LogNormal(0.0, 0.0), used_with=_SAMPLED)  # seconds
  availability: Uniform = bounded(Uniform(1.0, 1.0), used_with=_SAMPLED)
  jitter: float = bounded(0.0, min=0)  # sigma of the per-round lognormal bandwidth factor

  def check(self, key: str) -> None:
    if self.source == "trace":
      if self.trace is None:
        raise UserError(f"{key}.trace: missing; source: trace needs a CSV file")
      read_trace(self.trace)
      return
    for name in ("compute_speed", "down_bps", "up_bps"):
      if getattr(self, name).median <= 0:
        raise UserError(f"{key}.{name}.median: must be > 0, got {getattr(self, name).median}")


@dataclasses.dataclass(frozen=True)
class ClientProfile:
  compute_speed: float  # x the nominal rate: 2 computes twice as fast
  down_bps: float       # bits/s
  up_bps: float         # bits/s
  latency_s: float      # seconds, once per direction
  availability: float   # probability of being online when sampled


@dataclasses.dataclass(frozen=True)
class RoundLinks:
  """A client's links in one round, after jitter, and whether it is online."""

  down_bps: float
  up_bps: float
  online: bool


def _client_key(client_id: str) -> int:
  """A stable integer for a client id (Python's hash() is salted per process)."""
  return int.from_bytes(hashlib.sha256(client_id.encode("utf-8")).digest()[:16], "big")


def draw_profile(config: ProfilesConfig, seed: int, client_id: str) -> ClientProfile:
  """The profile of `client_id` under `config`: the same for every call."""
  rng = np.random.default_rng([seed, PROFILE_STREAM, _client_key(client_id)])
  z = rng.standard_normal(4)
  u = rng.random()
  return ClientProfile(
      compute_speed=config.compute_speed.draw(z[0]), down_bps=config.down_bps.draw(z[1]),
      up_bps=config.up_bps.draw(z[2]), latency_s=config.latency_s.draw(z[3]),
      availability=float(config.availability.low
                          + (config.availability.high - config.availability.low) * u))


def round_links(config: ProfilesConfig, profile: ClientProfile, seed: int, round_num: int,
                client_id: str) -> RoundLinks:
  """`profile`'s bandwidths in round `round_num` (jittered) and its availability draw."""
  rng = np.random.default_rng([seed, JITTER_STREAM, round_num, _client_key(client_id)])
  z = rng.standard_normal(2)
  online = bool(rng.random() < profile.availability)
  if config.jitter == 0:  # Exactly the profile's values, not x exp(0.0) rounding.
    return RoundLinks(profile.down_bps, profile.up_bps, online)
  return RoundLinks(float(profile.down_bps * np.exp(config.jitter * z[0])),
                    float(profile.up_bps * np.exp(config.jitter * z[1])), online)


@functools.lru_cache(maxsize=4)
def read_trace(path: str) -> Mapping[str, ClientProfile]:
  """Profiles from a CSV file with the header `TRACE_COLUMNS` (any column order).

  Raises:
    UserError: naming the file (and line) if it cannot be read, lacks a
      column, repeats a client or holds a value out of range.
  """
  where = os.path.expanduser(path)
  try:
    with open(where, newline="", encoding="utf-8") as f:
      reader = csv.DictReader(f)
      missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or ())]
      if missing:
        raise UserError(f"{path}: missing column '{missing[0]}'; a profile trace has columns"
                        f" {', '.join(TRACE_COLUMNS)}")
      profiles = {}
      for line, row in enumerate(reader, start=2):
        cid = (row["client_id"] or "").strip()
        if cid in profiles:
          raise UserError(f"{path}:{line}: client '{cid}' is listed twice")
        profiles[cid] = _trace_profile(row, f"{path}:{line}")
  except OSError as e:
    raise UserError(f"{path}: cannot read the profile trace ({e.strerror or e})") from None
  except UnicodeDecodeError:
    raise UserError(f"{path}: not a UTF-8 text (CSV) file") from None
  if not profiles:
    raise UserError(f"{path}: the profile trace has no clients")
  return profiles


def _trace_profile(row: Mapping[str, str], where: str) -> ClientProfile:
  values = {}
  for name in TRACE_COLUMNS[1:]:
    try:
      values[name] = float(row[name])
    except (TypeError, ValueError):
      raise UserError(f"{where}: {name} must be a number, got {row[name]!r}") from None
    if not np.isfinite(values[name]):
      raise UserError(f"{where}: {name} must be finite, got {row[name]!r}")
  for name in ("compute_speed", "down_bps", "up_bps"):
    if values[name] <= 0:
      raise UserError(f"{where}: {name} must be > 0, got {row[name]}")
  if values["latency_s"] < 0:
    raise UserError(f"{where}: latency_s must be >= 0, got {row['latency_s']}")
  if not 0 <= values["availability"] <= 1:
    raise UserError(f"{where}: availability must be between 0 and 1, got {row['availability']}")
  return ClientProfile(**values)


def profile_source(config: ProfilesConfig, seed: int,
                   population: Sequence[str]) -> Callable[[str], ClientProfile]:
  """A function from client id to that client's profile.

  Drawn profiles are drawn on demand (a population may be large); a trace is
  read once and checked against the clients of the data (`population`).

  Raises:
    UserError: the trace lists a client the data does not have, or lacks
      one it has (naming the file and the client).
  """
  if config.source == "sampled":
    return functools.partial(draw_profile, config, seed)
  return _checked_trace(config.trace, tuple(population)).__getitem__


@functools.lru_cache(maxsize=4)
def _checked_trace(path: str, population: tuple[str, ...]) -> Mapping[str, ClientProfile]:
  trace = read_trace(path)
  known = set(population)
  extra = next((cid for cid in trace if cid not in known), None)
  if extra is not None:
    raise UserError(f"system.profiles.trace: {path} lists client '{extra}',"
                    f" which is not in the data ({len(population)} clients)")
  absent = next((cid for cid in population if cid not in trace), None)
  if absent is not None:
    raise UserError(f"system.profiles.trace: {path} has no row for client '{absent}'"
                    " of the data")
  return trace
