"""The way back from a parsed config to plain YAML data: `to_plain` (the inverse
of `typed.parse`), `yaml_text` (one value as a config spells it) and `in_use`
(whether a `used_with` key matters for the values it was parsed with)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


def in_use(instance: Any, field: dataclasses.Field) -> bool:
  """False when `field` declares `used_with` and its condition does not hold."""
  condition = field.metadata.get("used_with")
  return condition is None or getattr(instance, condition[0]) in condition[1:]


def to_plain(obj: Any) -> Any:
  """The YAML-ready form of a parsed config (inverse of `typed.parse`)."""
  if hasattr(obj, "to_dict"):
    return obj.to_dict()
  if dataclasses.is_dataclass(obj):
    return {f.name: to_plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj) if f.init and in_use(obj, f)}
  if isinstance(obj, (list, tuple)):
    return [to_plain(v) for v in obj]
  if isinstance(obj, dict):
    return {k: to_plain(v) for k, v in obj.items()}
  return obj


def yaml_text(value: Any) -> str:
  """`value` as a config spells it (YAML flow style): null, true, [a, b], {k: v}."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  elif dataclasses.is_dataclass(value) and not isinstance(value, type):
    value = to_plain(value)
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, str):
    return value or "''"
  if isinstance(value, (list, tuple)):
    return "[" + ", ".join(yaml_text(v) for v in value) + "]"
  if isinstance(value, Mapping):
    return "{" + ", ".join(f"{k}: {yaml_text(v)}" for k, v in value.items()) + "}"
  return str(value)
