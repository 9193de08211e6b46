"""Reading experiment configs: YAML files, `--set` overrides and variants.

Configs are data: YAML is loaded safely (no object tags; see `yaml_syntax`
for the two ways it is stricter and kinder than plain YAML 1.1). The
only code a config imports is what it names: its `plugins` (imported before
validation, so that the names they register are known) and a custom
dataset's builder.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

import yaml

from fedsim.experiment.config import yaml_syntax
from fedsim.experiment.config.merge import apply_overrides, deep_merge, override_paths, parse_set, without
from fedsim.experiment.config.legacy import without_old_runtime_defaults
from fedsim.experiment.config.schema import ExperimentConfig
from fedsim.config.plain import to_plain
from fedsim.config.typed import parse_layered
from fedsim.errors import UserError
from fedsim.plugins import absolute_plugins, load_plugins, plugin_dir
from fedsim.registry import closest


# A config names its data and code; a larger file is data in the wrong place,
# and PyYAML would take minutes and gigabytes over it.
MAX_CONFIG_BYTES = 1 << 20


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
  """The mapping in YAML file `path`; UserError naming the file otherwise."""
  if not isinstance(path, (str, os.PathLike)):  # open() takes an int as a file descriptor
    raise UserError(f"config: expected a YAML file's path or a mapping of config keys, got"
                    f" {type(path).__name__} {path!r:.40}")
  try:
    with open(path, encoding="utf-8") as f:
      size = os.fstat(f.fileno()).st_size
      if size > MAX_CONFIG_BYTES:
        raise UserError(f"{path}: {size / 2**20:.1f} MiB; a config file is at most"
                        f" {MAX_CONFIG_BYTES >> 20} MiB (put data in a dataset file)")
      data = yaml_syntax.load(f)
  except yaml_syntax.DuplicateKeyError as e:
    raise UserError(f"{path}: line {e.line}: duplicate key '{e.key}'") from None
  except FileNotFoundError:
    raise UserError(f"{path}: config file not found") from None
  except IsADirectoryError:
    raise UserError(f"{path}: is a directory, expected a YAML config file") from None
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"{path}: cannot read config file ({e.__class__.__name__})") from None
  except yaml.YAMLError as e:
    mark = getattr(e, "problem_mark", None)
    where = f" line {mark.line + 1}" if mark else ""
    problem = getattr(e, "problem", None) or "invalid YAML"
    raise UserError(f"{path}:{where} not valid YAML: {problem}") from None
  if not isinstance(data, dict):
    raise UserError(f"{path}: expected a mapping of config keys at the top level")
  return data


def parse_config(raw: Mapping[str, Any]) -> ExperimentConfig:
  """Validates a raw config mapping (and each of its variants) into typed form."""
  return _validated(raw)[0]


def _validated(raw: Mapping[str, Any],
               set_paths: Sequence[str] = ()) -> tuple[ExperimentConfig, dict[str, Any]]:
  """(typed config, `raw` without the keys an override made meaningless).

  `set_paths` are the keys `--set` gave (see `typed.parse_layered`); every
  variant is validated too, laid over the result.
  """
  raw = without_old_runtime_defaults(raw)
  config, dropped = parse_layered(ExperimentConfig, raw, set_paths)
  raw = without(raw, dropped)
  for name, override in config.variants.items():
    for key in ("name", "variants", "plugins", "seeds"):
      if key in override:
        raise UserError(f"variants.{name}: a variant may not set '{key}'"
                        + (" (plugins are loaded once, for the whole config)"
                           if key == "plugins" else
                           " (every variant runs once per seed of the config's seeds)"
                           if key == "seeds" else ""))
    if config.seeds and "seed" in override:  # each of the seeds would replace it, silently
      raise UserError(f"variants.{name}: a variant may not set 'seed' when the config runs"
                      f" seeds {list(config.seeds)} (each replaces it)")
    try:
      _variant(raw, override)
    except UserError as e:
      raise UserError(f"variants.{name}: {e}") from None
  return config, raw


def _variant(base: Mapping[str, Any], override: Mapping[str, Any]) -> ExperimentConfig:
  """The config of a variant: `override` laid over `base`, then validated."""
  return parse_layered(ExperimentConfig, deep_merge(base, override),
                       override_paths(override))[0]


def load_config(source: str | os.PathLike | Mapping[str, Any],
                overrides: Sequence[str] = ()) -> tuple[ExperimentConfig, dict[str, Any]]:
  """Reads, overrides and validates a config. Returns (typed config, raw mapping).

  The config's `plugins` are imported first (relative `.py` paths are
  relative to the config file's directory, or to the working directory for
  a mapping).

  Raises:
    UserError: naming the file or key (or the plugin that failed to
      import); also for nesting too deep to walk.
  """
  try:
    raw = dict(source) if isinstance(source, Mapping) else read_yaml(source)
    raw = apply_overrides(raw, overrides)
    load_plugins(raw.get("plugins"), plugin_dir(source))
    if raw.get("plugins"):
      # As imported: the run's config.yaml then names the same files wherever it
      # is read from (`fedsim run --resume RUN_DIR` reads it from the run directory).
      raw["plugins"] = absolute_plugins(raw["plugins"], plugin_dir(source))
    set_paths = [path for item in overrides for path in override_paths(parse_set(item))]
    return _validated(raw, set_paths)
  except RecursionError:
    # PyYAML, deepcopy and the typed parser recurse once per nesting level.
    where = "config" if isinstance(source, Mapping) else str(source)
    raise UserError(f"{where}: nested too deeply to be a config") from None
  except UserError as e:
    # Messages quote the user's keys and names, which may hold line breaks or
    # control characters; the error must stay one printable line.
    text = str(e)
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if line == text:
      raise
    raise UserError(line) from None


def expand_variants(raw: Mapping[str, Any],
                    only: str | None = None) -> list[tuple[str | None, ExperimentConfig]]:
  """[(variant name, config)] to run: the variants in order, or (None, base).

  `only` names the one variant to return. With `seeds`, every variant is run
  once per seed (see `per_seed`).

  Raises:
    UserError: when `only` is not a variant of the config (listing them).
  """
  base = dict(raw)
  variants = base.pop("variants", None) or {}
  if only is not None:
    if only not in variants:
      names = ", ".join(map(str, variants))
      raise UserError(f"--variant {only}: " + (
          f"no such variant{closest(only, variants)}; the config's variants: {names}"
          if variants else "the config has no variants"))
    variants = {only: variants[only]}
  if not variants:
    return per_seed([(None, parse_config(base))])
  return per_seed([(name, _variant(base, override or {})) for name, override in variants.items()])


def per_seed(runs: Sequence[tuple[str | None, ExperimentConfig]]
             ) -> list[tuple[str | None, ExperimentConfig]]:
  """Each run once per seed of its `seeds` (in that order), or as it is without `seeds`.

  A seed's run is named '<variant>-seed<N>' ('seed<N>' without variants) and
  its config has `seed: N`, so its config.yaml records the seed.
  """
  out = []
  for name, config in runs:
    if not config.seeds:
      out.append((name, config))
    for seed in config.seeds:
      label = f"seed{seed}" if name is None else f"{name}-seed{seed}"
      out.append((label, dataclasses.replace(config, seed=seed)))
  return out


def plain(config: ExperimentConfig) -> dict[str, Any]:
  """The resolved config as YAML-ready data (what `config.yaml` holds)."""
  return to_plain(config)
