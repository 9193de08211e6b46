"""Turns plain YAML data into frozen, typed dataclasses, or one-line UserErrors.

Supported field types: bool, int, float, str, Literal[...], X | None,
list[X], tuple[X, ...], dict[str, X], nested dataclasses, and `Component`
(a registry name plus that entry's own parameter dataclass; the field's
metadata names the registry). Numeric bounds come from field metadata
(`min`, `max`, `gt`). A dataclass may define `check(self, key)` for
cross-field rules; it raises UserError.

A key that only matters for some values of another key of its section
declares it, `bounded(0.5, gt=0, used_with=("partition", "dirichlet"))`:
giving it with another value is an error naming it ("only used with
partition: dirichlet"), and the resolved config (`plain.to_plain`) leaves it
out. A string field may be a `choice` among a registry's names.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import numbers
import types
import typing
from typing import Any, Literal, Mapping

from fedsim.config.plain import in_use, to_plain, yaml_text
from fedsim.errors import UserError
from fedsim.registry import Registry, closest

# The largest integer a config may hold: TensorFlow takes counts and sizes as int64.
LARGEST_INT = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class Component:
  """A registry entry chosen by name, with its validated parameters."""

  name: str
  params: Any
  # Where the config wrote it (e.g. `aggregation[1]`, `compression.broadcast`), for
  # errors found after parsing; not part of what it is.
  key: str = dataclasses.field(default="", compare=False, repr=False)

  def to_dict(self) -> dict[str, Any]:
    return {"name": self.name, **to_plain(self.params)}


def bounded(default: Any = dataclasses.MISSING, **bounds: Any) -> Any:
  """A dataclass field with numeric bounds: min=, max= (inclusive), gt= (exclusive).

  `used_with=(other_key, value, ...)`: the key only matters when `other_key`
  of the same section has one of those values (see the module docstring).
  """
  return dataclasses.field(default=default, metadata=bounds)


def choice(registry: Registry, default: Any = dataclasses.MISSING, **bounds: Any) -> Any:
  """A string field naming an entry of `registry` (checked when parsed)."""
  return dataclasses.field(default=default, metadata={"choice_of": registry, **bounds})


def custom(parser, default: Any = None) -> Any:
  """A dataclass field parsed by `parser(data, key)` (sections with their own layout)."""
  return dataclasses.field(default=default, metadata={"parser": parser})


def component(registry: Registry, default: Any = dataclasses.MISSING) -> Any:
  """A dataclass field that holds a `Component` chosen from `registry`."""
  if isinstance(default, Mapping):
    frozen = dict(default)
    return dataclasses.field(default_factory=lambda: _from_registry(registry, frozen, "<default>"),
                             metadata={"registry": registry})
  return dataclasses.field(default=default, metadata={"registry": registry})


def _join(key: str, sub: str) -> str:
  return f"{key}.{sub}" if key else sub


def _describe(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 40 else text[:37] + "..."


def parse(cls: type, data: Any, key: str = "", reserved: tuple[str, ...] = ()) -> Any:
  """Builds dataclass `cls` from mapping `data`; `key` is its dotted config path.

  `reserved` names keys the caller consumed (such as a registry `name`); they
  only serve typo suggestions.
  """
  where = key or "config"
  if data is None:
    data = {}
  if isinstance(data, str) and "name" in {f.name for f in dataclasses.fields(cls)}:
    data = {"name": data}  # `runtime: inprocess`, as a registry section's `model: mlp`
  if not isinstance(data, Mapping):
    raise UserError(f"{where}: expected a mapping of keys, got {_describe(data)}")
  hints = typing.get_type_hints(cls)
  fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
  for name in data:
    if name not in fields:
      known = [*reserved, *fields]
      raise UserError(f"{_join(key, str(name))}: unknown key{closest(name, known)};"
                      f" valid keys here: {', '.join(sorted(known))}")
  values = {}
  for name, field in fields.items():
    sub = _join(key, name)
    if name in data:
      if data[name] is None and field.default is None:
        # An explicit null is the default, as config.yaml writes it: reading a
        # run's config.yaml back gives the config it was written from.
        values[name] = None
        continue
      if "parser" in field.metadata:
        values[name] = field.metadata["parser"](data[name], sub)
      elif "registry" in field.metadata:
        values[name] = _from_registry(field.metadata["registry"], data[name], sub)
      else:
        values[name] = _convert(hints[name], data[name], sub)
      _check_bounds(field.metadata, values[name], sub)
      if "choice_of" in field.metadata:
        field.metadata["choice_of"].get(values[name], sub)
    elif (field.default is dataclasses.MISSING
          and field.default_factory is dataclasses.MISSING):
      raise UserError(f"{sub}: missing required key")
  instance = cls(**values)
  if hasattr(instance, "check"):
    instance.check(key)
  stale = [name for name in data if not in_use(instance, fields[name])]
  if stale:
    for name in stale:
      _drop_inherited(fields[name], key, name)
      del values[name]
    instance = cls(**values)
  return instance


@dataclasses.dataclass
class _Layer:
  set_paths: frozenset[str]  # dotted paths an override set
  dropped: list[str]         # dotted paths of inherited keys left out


_LAYER: contextvars.ContextVar[_Layer | None] = contextvars.ContextVar("layer", default=None)


def parse_layered(cls: type, data: Any, set_paths) -> tuple[Any, list[str]]:
  """`parse` for `data` made by laying an override over a base config.

  `set_paths` are the dotted paths the override set. A key that no longer
  matters after the override changed the choice it depends on (the base
  has `partition: dirichlet, alpha: 0.3`, the override sets `partition:
  iid`) came from the base, so it is left out instead of refused, as a
  section whose `name` changes is replaced.

  Returns:
    (the parsed instance, dotted paths of the keys left out).
  """
  layer = _Layer(frozenset(set_paths), [])
  token = _LAYER.set(layer)
  try:
    return parse(cls, data), layer.dropped
  finally:
    _LAYER.reset(token)


def _drop_inherited(field: dataclasses.Field, key: str, name: str) -> None:
  """Records `key.name` as left out, or raises when the user gave it for nothing."""
  other, *values = field.metadata["used_with"]
  layer = _LAYER.get()
  path = _join(key, name)
  if (layer is not None and _covered(layer.set_paths, _join(key, other))
      and not _covered(layer.set_paths, path)):
    layer.dropped.append(path)
    return
  spelled = " or ".join(yaml_text(v) for v in values)
  raise UserError(f"{path}: only used with {other}: {spelled}")


def _covered(paths: frozenset[str], path: str) -> bool:
  return path in paths or any(path.startswith((p + ".", p + "[")) for p in paths)


def _from_registry(registry: Registry, data: Any, key: str) -> Component:
  if isinstance(data, str):
    data = {"name": data}
  if not isinstance(data, Mapping) or "name" not in data:
    raise UserError(f"{key}: expected a mapping with a 'name' key"
                    f" (one of: {', '.join(registry.names())}), got {_describe(data)}")
  entry = registry.get(data["name"], _join(key, "name"))
  rest = {k: v for k, v in data.items() if k != "name"}
  return Component(entry.name, parse(entry.params, rest, key, reserved=("name",)), key)


def _check_bounds(meta: Mapping[str, Any], value: Any, key: str) -> None:
  if value is None or not isinstance(value, (int, float)):
    return
  if "min" in meta and value < meta["min"]:
    raise UserError(f"{key}: must be >= {meta['min']}, got {value}")
  if "max" in meta and value > meta["max"]:
    raise UserError(f"{key}: must be <= {meta['max']}, got {value}")
  if "gt" in meta and not value > meta["gt"]:
    raise UserError(f"{key}: must be > {meta['gt']}, got {value}")


def _convert(tp: Any, value: Any, key: str) -> Any:
  origin = typing.get_origin(tp)
  args = typing.get_args(tp)
  if tp is Any:
    return value
  if origin in (typing.Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    options = [a for a in args if a is not type(None)]
    errors = []
    for option in options:
      try:
        return _convert(option, value, key)
      except UserError as e:
        errors.append(e)
    raise errors[0]
  if origin is Literal:
    if value not in args:
      raise UserError(f"{key}: must be one of {', '.join(map(str, args))};"
                      f" got {_describe(value)}{closest(value, map(str, args))}")
    return value
  if origin in (list, tuple):
    if not isinstance(value, (list, tuple)):
      raise UserError(f"{key}: expected a list, got {_describe(value)}")
    item_type = args[0] if args else Any
    items = [_convert(item_type, v, f"{key}[{i}]") for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items
  if origin is dict:
    if not isinstance(value, Mapping):
      raise UserError(f"{key}: expected a mapping, got {_describe(value)}")
    value_type = args[1] if len(args) == 2 else Any
    out = {}
    for k, v in value.items():
      if not isinstance(k, str):
        raise UserError(f"{key}: keys must be strings, got {_describe(k)}")
      out[k] = _convert(value_type, v, _join(key, k))
    return out
  if dataclasses.is_dataclass(tp):
    return parse(tp, value, key)
  if tp is bool:
    if not isinstance(value, bool):
      raise UserError(f"{key}: expected true/false, got {_describe(value)}")
    return value
  if tp is int:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
      value = int(value)
    # NumPy's integers too (a sweep's np.arange), as Python ints.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise UserError(f"{key}: expected an integer, got {_describe(value)}")
    if not -LARGEST_INT <= value <= LARGEST_INT:  # TensorFlow's int64s would overflow later
      raise UserError(f"{key}: {value} does not fit in a 64-bit integer (at most 2**63 - 1)")
    return int(value)
  if tp is float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      raise UserError(f"{key}: expected a number, got {_describe(value)}")
    if not math.isfinite(value):
      raise UserError(f"{key}: expected a finite number, got {value}")
    return float(value)
  if tp is str:
    if not isinstance(value, str):
      raise UserError(f"{key}: expected a string, got {_describe(value)}")
    return value
  raise TypeError(f"{key}: unsupported config field type {tp!r}")
