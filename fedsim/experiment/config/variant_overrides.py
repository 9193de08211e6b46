"""`--variant NAME --set key=value`: the key of that variant, as a user expects.

A `--set` laid over the base config would have to make sense there (the base
may have no `compression` section at all); with `--variant`, it is laid over
the variant's own section instead. A key inside a list, which `--set`
replaces whole, is answered with the `--set` that writes the list.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Mapping, Sequence

import yaml

from fedsim.errors import UserError
from fedsim.experiment.config.loader import load_config, read_yaml
from fedsim.experiment.config.merge import check_overrides, deep_merge, parse_set

ConfigSource = str | os.PathLike | Mapping[str, Any]


# Keys of the whole config, which a variant may not set (or, `seeds`, lists
# the seeds every variant runs with): a `--set` of them stays global.
_WHOLE_CONFIG_KEYS = ("name", "variants", "plugins", "seeds")


def variant_overrides(config: ConfigSource, overrides: Sequence[str],
                      variant: str | None) -> list[str]:
  """`--set` items as they apply with `--variant NAME`: to that variant.

  `--set key=value` becomes `--set variants.NAME.key=value`, laid over the
  variant's own section: `--variant adaquantfl --set
  compression.aggregation.bits.initial=2` changes the variant's encoder, not
  a base config that may have no such encoder. Keys of the whole config
  (`seeds`, `name`, `plugins`, `variants.*`) stay as given; so do all of them
  when the config has no variant NAME (its error then names the variants).

  Raises:
    UserError: a variant name holding '.', which a dotted key cannot reach.
  """
  if variant is None or not overrides:
    return list(overrides)
  raw = dict(config) if isinstance(config, Mapping) else read_yaml(config)
  if not isinstance(raw.get("variants"), Mapping) or variant not in raw["variants"]:
    return list(overrides)
  out = []
  for item in overrides:
    key = item.partition("=")[0].strip()
    if key.split(".")[0] in _WHOLE_CONFIG_KEYS:
      out.append(item)
    elif "." in variant:
      raise UserError(f"--variant {variant} --set {item}: a variant name with '.' cannot"
                      f" take --set keys; set {key} in the config's variants section")
    else:
      out.append(f"variants.{variant}.{item.lstrip()}")
  return out


def load_for_variant(config: ConfigSource, overrides: Sequence[str],
                     variant: str | None) -> dict[str, Any]:
  """The raw config with `overrides` laid over it (over `variant`'s section:
  see `variant_overrides`), validated.

  Raises:
    UserError: as `load_config`; when a `--set` key of the variant reaches
      into a list, which `--set` replaces whole, the message adds the
      `--set` that writes the list with the value changed.
  """
  check_overrides(overrides)
  try:
    return load_config(config, variant_overrides(config, overrides, variant))[1]
  except UserError as e:
    hint = _list_hint(config, overrides, variant)
    if hint is None:
      raise
    raise UserError(f"{e}; {hint}") from None


def _list_hint(config: ConfigSource, overrides: Sequence[str], variant: str | None) -> str | None:
  """'the variant's ... is in the list X, ...: --set 'X=[...]'' for the first
  `--set` whose key is missing from `variant`'s config but whose tail names a
  key inside one of its lists; None if none does."""
  if variant is None:
    return None
  raw = dict(config) if isinstance(config, Mapping) else read_yaml(config)
  variants = raw.get("variants")
  section = variants.get(variant) if isinstance(variants, Mapping) else None
  if not isinstance(section, Mapping):
    return None
  merged = deep_merge({k: v for k, v in raw.items() if k != "variants"}, section)
  for item in overrides:
    key, _, text = item.partition("=")
    parts = key.strip().split(".")
    if parts[0] in _WHOLE_CONFIG_KEYS or _reaches(merged, parts[:-1]):
      continue
    for size in range(len(parts) - 1, 0, -1):
      found = _in_list(merged, parts[-size:])
      if found is not None:
        top, path = found
        changed = copy.deepcopy(merged[top])
        node = changed
        for step in path[:-1]:
          node = node[step]
        node[path[-1]] = parse_set(f"x={text}")["x"]
        flow = yaml.safe_dump(changed, default_flow_style=True, width=10**6,
                              sort_keys=False).strip()
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
        return (f"variant {variant} has no {'.'.join(parts[:-1])}: its {'.'.join(parts[-size:])}"
                f" is {top}{where}, in a list, which --set replaces whole: --variant {variant}"
                f" --set '{top}={flow}'")
  return None


def _reaches(node: Any, parts: Sequence[str]) -> bool:
  for part in parts:
    if not isinstance(node, Mapping) or part not in node:
      return False
    node = node[part]
  return True


def _in_list(merged: Mapping[str, Any], tail: Sequence[str]) -> tuple[str, list] | None:
  """(top-level key, path inside it) of the first key path ending in `tail`
  that passes through a list, or None."""
  def walk(node, path, through_list):
    if isinstance(node, Mapping):
      if through_list and _reaches(node, tail):
        return [*path, *tail]
      for k, v in node.items():
        if (found := walk(v, [*path, k], through_list)) is not None:
          return found
    elif isinstance(node, list):
      for i, v in enumerate(node):
        if (found := walk(v, [*path, i], True)) is not None:
          return found
    return None
  for key, value in merged.items():
    found = walk(value, [], False)
    if found is not None:
      return key, found
  return None
