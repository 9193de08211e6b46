"""`fedsim list`: what a config can name, registry by registry, with typed parameters.

One line per entry, `<registry> <name>  <key>: <type> = <default>, ...`, in
the config's own vocabulary (YAML values, `a|b` for a choice), followed by
the summary line of the entry's docstring. Imports no TensorFlow: registering
modules keep TF inside their builders.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from typing import Any, Literal, Mapping

from fedsim.config.plain import yaml_text
from fedsim.errors import UserError
from fedsim.registry import REGISTRIES, Registry, closest

# Importing these creates and fills every registry fedsim has; the schema
# last, for any registry a config section uses that the others miss.
_PACKAGES = ("fedsim.models", "fedsim.data", "fedsim.algorithms", "fedsim.compression",
             "fedsim.learning.optimizers", "fedsim.system.clock", "fedsim.aggregation",
             "fedsim.control", "fedsim.experiment.config.schema")


def registries() -> list[Registry]:
  """Every registry, built-ins imported (plus those of plugins already loaded), by kind."""
  for name in _PACKAGES:
    try:
      importlib.import_module(name)
    except ModuleNotFoundError as e:
      if e.name != name:  # only a package this fedsim does not have is skipped
        raise
  return sorted(REGISTRIES, key=lambda r: r.name)


def format_catalog(kind: str | None = None) -> str:
  """The text of `fedsim list [kind]`: one block per registry, blank lines between.

  Raises:
    UserError: when `kind` names no registry (with the closest kind).
  """
  chosen = registries()
  if kind is not None:
    wanted = _normalize(kind)
    # A registry's one-word name, or its kind as fedsim once listed it ('aggregation stage').
    chosen = [r for r in chosen
              if {wanted, wanted.rstrip("s")} & {_normalize(r.name), _normalize(r.kind)}]
    if not chosen:
      kinds = sorted({r.name for r in registries()})
      raise UserError(f"list: no registry '{kind}'{closest(kind, kinds)}; choose one of:"
                      f" {', '.join(kinds)}")
  return "\n\n".join(format_registry(r) for r in chosen)


def format_registry(registry: Registry) -> str:
  """One registry's lines: each entry with its parameters, then its summary."""
  entries = registry.entries()
  width = max((len(e.name) for e in entries), default=0)
  lines = []
  for entry in entries:
    lines.append(f"{registry.name} {entry.name:<{width}}  {describe_params(entry.params)}")
    if entry.summary:
      lines.append(f"    {entry.summary}")
  return "\n".join(lines) or f"{registry.name}: (no entries)"


@dataclasses.dataclass(frozen=True)
class Param:
  """One parameter of an entry, in the config's vocabulary."""
  name: str
  type: str             # e.g. 'int', 'stochastic|deterministic', 'float | None'
  default: str | None   # as YAML; None when the key is required
  used_with: str = ""   # 'speed: lognormal' for a key only that choice reads

  def __str__(self) -> str:
    text = f"{self.name}: {self.type}"
    text += " (required)" if self.default is None else f" = {self.default}"
    return text + (f" (with {self.used_with})" if self.used_with else "")


def params_of(params: type) -> list[Param]:
  """The parameters of a parameter dataclass, in field order (what `fedsim list`
  and the documentation's reference pages show)."""
  hints = typing.get_type_hints(params)
  out = []
  for field in dataclasses.fields(params):
    if not field.init:
      continue
    if field.default is not dataclasses.MISSING:
      default = yaml_text(field.default)
    elif field.default_factory is not dataclasses.MISSING:
      default = yaml_text(field.default_factory())
    else:
      default = None
    used_with = ""
    if "used_with" in field.metadata:
      other, *values = field.metadata["used_with"]
      used_with = f"{other}: {' or '.join(yaml_text(v) for v in values)}"
    out.append(Param(field.name, _type_text(hints[field.name], field.metadata), default,
                     used_with))
  return out


def describe_params(params: type) -> str:
  """`key: type = default, ...` for a parameter dataclass ('(no parameters)' if none)."""
  return ", ".join(map(str, params_of(params))) or "(no parameters)"


def _type_text(tp: Any, metadata: Mapping[str, Any] = types.MappingProxyType({})) -> str:
  if "registry" in metadata:
    return metadata["registry"].name
  if "choice_of" in metadata:
    return "|".join(metadata["choice_of"].names())
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if origin is Literal:
    return "|".join(yaml_text(a) for a in args)
  if origin in (typing.Union, types.UnionType):
    return " | ".join("None" if a is type(None) else _type_text(a) for a in args)
  if origin in (list, tuple, dict):
    inner = ", ".join("..." if a is Ellipsis else _type_text(a) for a in args)
    return f"{origin.__name__}[{inner}]" if inner else origin.__name__
  if tp is Any:
    return "any"
  return getattr(tp, "__name__", str(tp))


def _normalize(kind: str) -> str:
  return " ".join(kind.lower().replace("_", " ").replace("-", " ").split())
