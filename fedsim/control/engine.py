"""Encoder parameters that change across rounds and clients: a run's controller and
the rounds (variants) it asks for.

A controlled parameter (`bits: {controller: adaquantfl, initial: 2, max: 8}`)
turns the round into a family of rounds, one per value. Each value's
algorithm is built exactly as a config with that value fixed would build it,
on first use, and cached: its bits are sized from its own compiled round, so
a client's upload is counted at the size its value really has. Before each
round the controller decides, from what the server knows (a `ServerView`),
one value for every client or one per client; each client runs its value's
round, and clients of different values are accumulated into one sum
(`fedsim.runtime.mixed`, which takes the groups as data). The run loop asks
`fedsim.experiment.round_setting` for each round's values; a run without a
controller is the one-value case.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

from fedsim.config.typed import Component
from fedsim.control import CONTROLLERS, Knob
from fedsim.control.parsing import ControlSpec
from fedsim.errors import UserError

DIRECTIONS = ("aggregation", "broadcast")


@dataclasses.dataclass(frozen=True)
class Controlled:
  """Where the controlled parameter is: its direction and its stage's index in that chain."""

  direction: str
  index: int
  spec: ControlSpec
  encoder: str
  stage_key: str = ""   # where the config wrote the stage (`Component.key`)

  @property
  def key(self) -> str:
    """The controlled parameter's config key, e.g. `compression.aggregation.bits`."""
    return f"{self.stage_key or f'{self.direction}[{self.index}]'}.{self.spec.param}"


def find_controlled(chains: Mapping[str, Sequence[Component]]) -> Controlled | None:
  """The one encode stage of `chains` (direction -> stages) with a controlled parameter.

  Raises:
    UserError: more than one stage is controlled.
  """
  found = [Controlled(direction, i, stage.params.control, stage.params.encoder.name, stage.key)
           for direction in DIRECTIONS for i, stage in enumerate(chains.get(direction, ()))
           if stage.name == "encode" and getattr(stage.params, "control", None) is not None]
  if len(found) > 1:
    raise UserError(f"{found[1].key}: one controlled encoder parameter per run ({found[0].key}"
                    " already is)")
  return found[0] if found else None


def check_schedule(controlled: Controlled | None, schedule: str, algorithm: str) -> None:
  """Refuses a controlled encoder parameter for an algorithm whose rounds are
  not synchronous (`schedule`, e.g. FedBuff's 'buffered'): a controller sets
  each round's value, and such an algorithm has no rounds of its clients.

  Raises:
    UserError: naming the controlled parameter's key.
  """
  if controlled is not None and schedule != "synchronous":
    raise UserError(f"{controlled.key}: a controller needs synchronous rounds; algorithm"
                    f" '{algorithm}' applies updates as they arrive")


def fixed_chain(stages: Sequence[Component], controlled: Controlled, value: float) -> tuple:
  """`stages` with the controlled parameter fixed at `value` (the chain of a plain config)."""
  out = list(stages)
  stage = out[controlled.index]
  out[controlled.index] = dataclasses.replace(stage, params=stage.params.with_value(value))
  return tuple(out)


@dataclasses.dataclass
class Variant:
  """The algorithm of one value of the controlled parameter, its round and its sizes
  (the round is compiled and the sizes measured when first asked for)."""

  value: float
  algorithm: Any
  _build_process: Callable[[Any, float], Any]
  _size: Callable[[Any], Any]
  _process: Any = None
  _wire: Any = None

  @property
  def process(self) -> Any:
    if self._process is None:
      self._process = self._build_process(self.algorithm, self.value)
    return self._process

  @property
  def wire(self) -> Any:
    """Its ClientWireBits."""
    if self._wire is None:
      self._wire = self._size(self.algorithm)
    return self._wire


class RoundControl:
  """The controller of a run and the variants it has asked for."""

  def __init__(self, controlled: Controlled, build_algorithm: Callable[[float], Any],
               build_process: Callable[[Any, float], Any], size: Callable[[Any], Any],
               first: Variant | None = None):
    self.controlled = controlled
    spec = controlled.spec
    self._entry = CONTROLLERS.get(spec.controller.name)
    self.controller = self._entry.build(spec.controller.params)
    self._build_algorithm, self._build_process, self._size = build_algorithm, build_process, size
    self._variants: dict[float, Variant] = {}
    self._state_type = None
    if first is not None:
      self._add(first)

  @property
  def name(self) -> str:
    return self._entry.name

  def variant(self, value: float) -> Variant:
    """The variant of `value`, built on first use.

    Raises:
      UserError: its server state differs from the other values' (the
        encoder keeps state shaped by the parameter: it cannot change per round).
    """
    value = self._normal(value)
    if value not in self._variants:
      self._add(Variant(value, self._build_algorithm(value), self._build_process, self._size))
    return self._variants[value]

  def _add(self, variant: Variant) -> None:
    state_type = variant.algorithm.process.initialize.type_signature.result
    if self._state_type is None:
      self._state_type = state_type
    elif not state_type.is_equivalent_to(self._state_type):
      raise UserError(f"{self.controlled.key}: encoder '{self.controlled.encoder}' keeps a"
                      f" server state that depends on '{self.controlled.spec.param}'; it cannot"
                      " change between rounds")
    self._variants[variant.value] = variant

  def _normal(self, value: float) -> float:
    spec = self.controlled.spec
    return int(value) if spec.integer else float(value)

  def knob(self) -> Knob:
    """The `fedsim.control.Knob` controllers see."""
    spec = self.controlled.spec
    size = (lambda v: self.variant(v).wire.aggregate) if self.controlled.direction == \
        "aggregation" else (lambda v: self.variant(v).wire.broadcast)
    return Knob(encoder=self.controlled.encoder, param=spec.param, initial=spec.initial,
                minimum=spec.minimum, maximum=spec.maximum, integer=spec.integer,
                upload_bits=size)

  def initial_state(self) -> dict:
    return dict(self.controller.initial_state())

  def decide(self, state: dict, view) -> tuple[dict, dict[str, float]]:
    """(the controller's new state, each sampled client's value), values checked.

    Raises:
      UserError: naming the controller and round, for a value outside the
        knob's bounds, not an integer for an integer parameter, a client it
        was not asked about, or a per-client broadcast.
    """
    new_state, decision = self.controller.decide(state, view)
    ids = [c.id for c in view.clients]
    where = f"controller '{self.name}', round {view.round}"
    if isinstance(decision, Mapping):
      if set(decision) != set(ids):
        raise UserError(f"{where}: gave values for clients {sorted(decision)[:3]}..., not for"
                        " exactly the round's sampled clients")
      if self.controlled.direction == "broadcast" and len(set(decision.values())) > 1:
        raise UserError(f"{where}: per-client values for a broadcast encoder (the server"
                        " encodes the model once per round)")
      values = {cid: decision[cid] for cid in ids}
    else:
      values = {cid: decision for cid in ids}
    spec = self.controlled.spec
    for value in values.values():
      if (isinstance(value, bool) or not isinstance(value, (int, float))
          or not math.isfinite(value)):
        raise UserError(f"{where}: value {value!r:.40} is not a number")
      if not spec.minimum <= value <= spec.maximum:
        raise UserError(f"{where}: value {value} is outside [{spec.minimum}, {spec.maximum}]")
      if spec.integer and value != int(value):
        raise UserError(f"{where}: value {value} is not an integer ('{spec.param}' is)")
    return dict(new_state), {cid: self._normal(v) for cid, v in values.items()}


def control_metrics(param: str, values: Sequence[float]) -> dict[str, float]:
  """`control/<param>_mean`, `_min` and `_max` over the round's aggregated clients
  (its sampled ones when none was aggregated)."""
  if not values:
    return {}
  return {f"control/{param}_mean": sum(values) / len(values),
          f"control/{param}_min": min(values), f"control/{param}_max": max(values)}
