"""An encoder parameter set by a controller before each round: its config and parsing.

Config: the parameter's value is a mapping instead of a number, e.g.
`bits: {controller: adaquantfl, initial: 2, max: 8}` (see `fedsim.control`
for the controllers, `fedsim.control.engine` for how a run uses it).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping

from fedsim.config.typed import Component, parse
from fedsim.control import CONTROLLERS, KNOB_KEYS
from fedsim.errors import UserError


@dataclasses.dataclass(frozen=True)
class ControlSpec:
  """An encoder parameter that a controller sets before each round.

  Config: the parameter's value is a mapping, e.g.
  `bits: {controller: adaquantfl, initial: 2, max: 8}`; `initial` (default:
  the encoder's default), `min` and `max` (default: the parameter's bounds)
  are the knob's, every other key is the controller's own (`controller.params`).
  """

  param: str
  controller: Component
  initial: float
  minimum: float
  maximum: float
  integer: bool

  def to_dict(self) -> dict[str, Any]:
    # The controller's keys that differ from their defaults: a key that only
    # applies with another key's value (e.g. a schedule's `end` with `kind:
    # linear`) is refused when given otherwise, even at its default.
    params = self.controller.params
    own = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)
           if f.default is dataclasses.MISSING or getattr(params, f.name) != f.default}
    return {"controller": self.controller.name, "initial": self.initial, "min": self.minimum,
            "max": self.maximum, **own}


def parse_control(entry, data: Mapping[str, Any], key: str) -> ControlSpec | None:
  """The encoder parameter given as `{controller: NAME, ...}`, if any.

  Raises:
    UserError: naming the key: more than one controlled parameter, one that
      is not a number, an unknown controller or controller key, or bounds
      outside the parameter's.
  """
  controlled = [k for k, v in data.items()
                if isinstance(v, Mapping) and k not in ("encoder",) and "controller" in v]
  if not controlled:
    return None
  if len(controlled) > 1:
    raise UserError(f"{key}.{controlled[1]}: one controlled parameter per encoder"
                    f" ('{controlled[0]}' already is)")
  name = controlled[0]
  where = f"{key}.{name}"
  field = {f.name: f for f in dataclasses.fields(entry.params)}[name]
  kind = typing.get_type_hints(entry.params).get(name)
  if kind not in (int, float) or isinstance(field.default, bool):
    raise UserError(f"{where}: encoder '{entry.name}' parameter '{name}' is not a number;"
                    " a controller sets numeric parameters only")
  spec = data[name]
  controller = CONTROLLERS.get(spec["controller"], f"{where}.controller")
  own = {k: v for k, v in spec.items() if k not in KNOB_KEYS}
  params = parse(controller.params, own, where, reserved=KNOB_KEYS)
  bounds = field.metadata
  default = field.default if field.default is not dataclasses.MISSING else None

  def number(k: str, fallback: Any) -> float:
    value = spec.get(k, fallback)
    if value is None:
      raise UserError(f"{where}.{k}: required (encoder '{entry.name}' gives '{name}' no {k})")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise UserError(f"{where}.{k}: expected a number, got {value!r:.40}")
    if kind is int and value != int(value):
      raise UserError(f"{where}.{k}: '{name}' is an integer, got {value!r}")
    parse(entry.params, {name: kind(value)}, key)  # within the parameter's own bounds
    return kind(value)

  minimum = number("min", bounds.get("min"))
  maximum = number("max", bounds.get("max"))
  initial = number("initial", default)
  if not minimum <= initial <= maximum:
    raise UserError(f"{where}.initial: {initial} is outside [min, max] = [{minimum}, {maximum}]")
  return ControlSpec(name, Component(controller.name, params), initial, minimum, maximum,
                     kind is int)
