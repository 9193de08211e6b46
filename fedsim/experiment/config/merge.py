"""How a variant or a `--set` is laid over a config: one rule for both.

* A mapping over a mapping merges key by key, except when it changes the
  section's choice (its `name`, or a compression direction's `encoder`): then
  it replaces the section, since the old entry's keys mean nothing to the new
  one (`--set data.name=emnist` does not carry `partition: dirichlet` along).
* An empty mapping `{}` or null replaces (clears) the section.
* Anything else, lists included, replaces the value: lists are never merged.
* A string where a section is, `model: mlp`, counts as `{name: mlp}`.

`--set a.b.c=v` is the override `{a: {b: {c: v}}}`.
"""

from __future__ import annotations

import copy
from typing import Any, Iterator, Mapping, Sequence

import yaml

from fedsim.experiment.config import yaml_syntax
from fedsim.errors import UserError

# Keys whose value picks a registry entry: changing one replaces its section.
CHOICE_KEYS = ("name", "encoder")


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any],
               _path: tuple[str, ...] = ()) -> dict[str, Any]:
  """`override` laid over `base` by the rule above (neither is modified)."""
  merged = copy.deepcopy(dict(base))
  for key, value in override.items():
    old, new = _as_sections(merged.get(key), value, _path + (str(key),))
    if old is not None and new and not _choice_changed(old, new):
      merged[key] = deep_merge(old, new, _path + (str(key),))
    else:
      merged[key] = copy.deepcopy(value)
  return merged


def _as_sections(old: Any, new: Any, path: tuple[str, ...]) -> tuple[Any, Any]:
  """(old, new) as two mappings when both are sections, else (None, None)."""
  if isinstance(old, Mapping) and isinstance(new, Mapping):
    return old, new
  if isinstance(old, str) and isinstance(new, Mapping) and new:
    return {_choice_key(new) or _shorthand_key(path): old}, new
  if isinstance(old, Mapping) and isinstance(new, str) and _choice_key(old):
    return old, {_choice_key(old): new}
  return None, None


def _choice_key(section: Mapping[str, Any]) -> str | None:
  return next((k for k in CHOICE_KEYS if k in section), None)


def _shorthand_key(path: tuple[str, ...]) -> str:
  # `compression: {aggregation: uniform}` is the one shorthand that is not a name.
  return "encoder" if len(path) == 2 and path[0] == "compression" else "name"


def _choice_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
  return any(k in new and k in old and new[k] != old[k] for k in CHOICE_KEYS)


def parse_set(item: str, current: Mapping[str, Any] | None = None,
              flag: str = "--set") -> dict[str, Any]:
  """The override mapping of one `--set dotted.key=value` (value parsed as YAML).

  `current`, the config it will be laid over, is only checked: a key may not
  reach into a value that is not a section. `flag`: what the item was given
  as, for the error ("" for a bare KEY=VALUE argument).

  Raises:
    UserError: naming the item (after `flag`) when it is malformed.
  """
  culprit = f"{flag} {item}" if flag else item
  key, sep, text = item.partition("=")
  parts = key.strip().split(".")
  if not sep or not all(parts):
    raise UserError(f"{culprit}: expected dotted.key=value")
  try:
    value = yaml_syntax.load(text) if text.strip() else ""
  except yaml_syntax.DuplicateKeyError as e:
    raise UserError(f"{culprit}: duplicate key '{e.key}'") from None
  except yaml.YAMLError:
    raise UserError(f"{culprit}: value is not valid YAML") from None
  node = current
  for i, part in enumerate(parts[:-1]):
    node = node.get(part) if isinstance(node, Mapping) else None
    if node is None or isinstance(node, str):
      break  # a new section, or `model: mlp` shorthand: both take keys
    if not isinstance(node, Mapping):
      raise UserError(f"{culprit}: '{'.'.join(parts[:i + 1])}' is not a section")
  for part in reversed(parts):
    value = {part: value}
  return value


def check_overrides(overrides: Any) -> Sequence[str]:
  """`overrides` if it is a list (or tuple) of strings, as `--set` gives them.

  Raises:
    UserError: naming what was given instead (a string would be read one
      character at a time, a mapping by its keys alone).
  """
  if (isinstance(overrides, (str, bytes, Mapping)) or not isinstance(overrides, Sequence)
      or not all(isinstance(item, str) for item in overrides)):
    raise UserError("overrides: expected a list of 'dotted.key=value' strings, e.g."
                    f" ['rounds=3'], got {type(overrides).__name__} {overrides!r:.40}")
  return overrides


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
  """`raw` with each `dotted.key=value` of `overrides` laid over it, in order."""
  result = copy.deepcopy(dict(raw))
  for item in check_overrides(overrides):
    result = deep_merge(result, parse_set(item, result))
  return result



def override_paths(override: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
  """Dotted paths of the values an override sets (a cleared section is one path)."""
  for key, value in override.items():
    path = f"{prefix}{key}"
    if isinstance(value, Mapping) and value:
      yield from override_paths(value, f"{path}.")
    else:
      yield path


def without(raw: Mapping[str, Any], paths) -> dict[str, Any]:
  """A copy of `raw` without the keys at dotted `paths` (missing ones are ignored)."""
  result = copy.deepcopy(dict(raw))
  for path in paths:
    *parents, last = path.split(".")
    node = result
    for part in parents:
      node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
      node.pop(last, None)
  return result
