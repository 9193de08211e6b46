"""Controllers: rules that set an encoder's numeric parameter before each round.

Config: the parameter's value is a mapping instead of a number,

  aggregation:
    - {name: encode, encoder: uniform, bits: {controller: adaquantfl, initial: 2, max: 8}}

`controller` names an entry of `CONTROLLERS`; `initial`, `min` and `max` (the
knob's keys, `KNOB_KEYS`) are read into the `Knob`; every other key is the
controller's own and is parsed into its params dataclass
(`fedsim.control.parsing`). Before each round the run's `RoundControl`
(`fedsim.control.engine`) hands the controller its state and a `ServerView` (the
round, the metrics rows of previous rounds, the sampled clients and their
links) and gets back the new state and either one value for every client or
one value per client id.

A controller's state is server state: a JSON-serializable dict, checkpointed
and restored on resume, so `decide` must be a deterministic function of
(state, view). Built-ins: `schedule`, `adaquantfl`, `dadaquant`,
`link_budget`. This package imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Protocol

from fedsim.registry import NoParams, Registry

CONTROLLERS = Registry("controller")

# The keys every controller takes (read into `Knob`); the others are the controller's own.
KNOB_KEYS = ("controller", "initial", "min", "max")


def register_controller(name: str, params: type = NoParams, replace: bool = False) -> Callable:
  """Decorator that adds a controller, selectable as `{controller: NAME, ...}` in config.

  The decorated function `build(params) -> Controller` receives the parsed
  `params` dataclass (the mapping's keys other than `KNOB_KEYS`) and returns
  an object with `initial_state()` and `decide(state, view)` (see
  `Controller`). The first line of its docstring is what `fedsim list
  controller` shows.

  Raises:
    TypeError: `params` is not a dataclass.
    ValueError: `name` is taken, unless `replace`.
  """
  return CONTROLLERS.register(name, params, replace)


@dataclasses.dataclass(frozen=True)
class ClientView:
  """What the server knows of one sampled client before the round."""

  id: str
  examples: int                # examples it trains on this round (its weight in FedAvg)
  up_bps: float | None         # its uplink this round, bits/s; None without system.profiles
  down_bps: float | None
  latency_s: float             # once per direction (0 without profiles)
  compute_seconds: float       # its local training time this round (0 without a device model)
  download_bits: int           # what it receives this round


@dataclasses.dataclass(frozen=True)
class Knob:
  """The controlled parameter: which one, its bounds, and what a value costs."""

  encoder: str                 # e.g. "uniform"
  param: str                   # e.g. "bits", "levels", "fraction", "k"
  initial: float               # the configured starting value
  minimum: float               # bounds: the controller's min/max, else the parameter's own
  maximum: float
  integer: bool                # the encoder's parameter is an int
  upload_bits: Callable[[float], int]  # exact bits one client sends at that value


@dataclasses.dataclass(frozen=True)
class ServerView:
  """The typed record a controller decides from."""

  round: int                   # the round about to run (1-based)
  # metrics rows of previous rounds, oldest first, keys as in metrics.csv
  # (fedsim.metric_names: "train/loss", "eval/accuracy" in rounds that evaluated, ...)
  history: tuple[Mapping[str, float], ...]
  clients: tuple[ClientView, ...]  # this round's sampled clients, in order
  deadline_s: float | None     # system.deadline_seconds
  knob: Knob


class Controller(Protocol):
  def initial_state(self) -> dict:
    """The state before round 1: JSON-serializable (numbers, lists, strings)."""

  def decide(self, state: dict, view: ServerView) -> tuple[dict, float | Mapping[str, float]]:
    """(new state, the value for this round): one number for every client, or
    client id -> number for each sampled client."""


def clamp(value: float, knob: Knob) -> float:
  """`value` within [knob.minimum, knob.maximum], rounded half up to an int for
  an integer knob. NaN is returned as is (the engine refuses it, naming the
  controller)."""
  if math.isnan(value):
    return value
  if knob.integer:
    low, high = math.ceil(knob.minimum), math.floor(knob.maximum)
    if math.isinf(value):
      return low if value < 0 else high
    return int(min(max(math.floor(value + 0.5), low), high))
  return float(min(max(value, knob.minimum), knob.maximum))


def metric(row: Mapping[str, float], key: str) -> float | None:
  """Metric `key` of a metrics row as a float, or None when it is missing or not a
  finite number (a round that skipped training, a row read back as text)."""
  try:
    value = float(row[key])
  except (KeyError, TypeError, ValueError):
    return None
  return value if math.isfinite(value) else None


def latest(history, key: str) -> float | None:
  """The newest finite value of metric `key` in `history`, or None."""
  return next((v for row in reversed(history) if (v := metric(row, key)) is not None), None)


def earliest(history, key: str) -> float | None:
  """The oldest finite value of metric `key` in `history`, or None."""
  return next((v for row in history if (v := metric(row, key)) is not None), None)


# The built-ins register themselves (after the names above, which they import).
from fedsim.control import adaquantfl as _adaquantfl  # noqa: E402,F401
from fedsim.control import dadaquant as _dadaquant  # noqa: E402,F401
from fedsim.control import link_budget as _link_budget  # noqa: E402,F401
from fedsim.control import schedule as _schedule  # noqa: E402,F401
