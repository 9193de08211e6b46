"""Configs written by older fedsim versions, read by this one.

Before runtimes were a registry, every run's config.yaml listed all runtime
keys of a single flat section (a `local` run wrote `device: auto`, `workers:
2`, ...). Such a key that the named runtime no longer declares, at the value
every old run wrote for it, carried no choice: it is dropped, so old run
directories still resume. Any other value of a foreign key is still refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from fedsim.runtime.runtime_registry import RUNTIMES

# The flat section's keys and the defaults it wrote.
_OLD_RUNTIME_DEFAULTS = {
    "device": "auto", "threads": "clients", "precision": "float32", "address": "local",
    "workers": 2, "cpus_per_worker": 1.0, "gpus_per_worker": 0.0, "timeout_s": 1800.0,
}


def without_old_runtime_defaults(raw: Mapping[str, Any]) -> Mapping[str, Any]:
  """`raw` with the old flat runtime keys at their old defaults dropped where its
  runtime (and each variant's) does not declare them."""
  out = dict(raw)
  if isinstance(raw.get("runtime"), Mapping):
    out["runtime"] = _section(raw["runtime"], raw["runtime"].get("name"))
  variants = raw.get("variants")
  if isinstance(variants, Mapping):
    base = raw.get("runtime") if isinstance(raw.get("runtime"), Mapping) else {}
    out["variants"] = {
        name: ({**v, "runtime": _section(v["runtime"], v["runtime"].get("name", base.get("name")))}
               if isinstance(v, Mapping) and isinstance(v.get("runtime"), Mapping) else v)
        for name, v in variants.items()}
  return out


def _section(section: Mapping[str, Any], name: Any) -> Mapping[str, Any]:
  if not isinstance(name, str) or name not in RUNTIMES:
    return section
  declared = {f.name for f in dataclasses.fields(RUNTIMES.get(name).params)}
  return {k: v for k, v in section.items()
          if k == "name" or k in declared or k not in _OLD_RUNTIME_DEFAULTS
          or v != _OLD_RUNTIME_DEFAULTS[k]}
