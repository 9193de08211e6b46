"""MkDocs hook: writes the reference pages from fedsim's own sources at build time.

`reference/registries.md` lists every registry entry with its typed parameters,
from `fedsim.catalog` (what `fedsim list` prints), and `reference/config.md`
every experiment config key, from the dataclasses of
`fedsim.experiment.config.schema`. A page that lists a registry's names writes
`<!-- registry: NAME -->` where they go (`on_page_markdown` fills them in).
Generated on each build, they cannot drift from the code. Imports no
TensorFlow (registering modules keep it in builders).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing

from mkdocs.structure.files import File

REGISTRIES_PAGE = "reference/registries.md"
CONFIG_PAGE = "reference/config.md"

# What a top-level key means, for keys whose field in schema.py has no comment
# (a comment there, once written, takes precedence).
KEY_MEANINGS = {
    "name": "names the experiment: runs go to `<logdir>/<name>/<run>/`",
    "rounds": "rounds to run (server updates, for `fedbuff`)",
    "clients_per_round": "clients aggregated each round",
    "data": "the federated dataset, its partition and batching",
    "model": "the model trained",
    "algorithm": "the federated algorithm and its optimizers",
    "seed": "seeds everything: partition, sampling, shuffling, initialization, encoders' noise",
    "system": "the simulated clock: client speeds, dropouts, devices and links, deadline",
    "eval": "evaluation of the global model on the held-out test set",
    "checkpoint": "checkpoints for `--resume`",
    "broadcast": "server -> clients stages (at most one `encode`)",
    "compression": "shorthand for a final `encode` stage in each direction",
    "description": "free text, kept in the run's config.yaml",
}


def on_files(files, config):
  for path, text in ((REGISTRIES_PAGE, registries_page()), (CONFIG_PAGE, config_page())):
    files.append(File.generated(config, path, content=text))
  return files


_REGISTRY_MARK = re.compile(r"<!-- registry: (\w+) -->")


def on_page_markdown(markdown, page, config, files):
  """Writes, after each `<!-- registry: NAME -->`, ': ' and that registry's
  entry names; an unknown NAME fails the build."""
  from fedsim.catalog import registries
  names = {registry.name: [entry.name for entry in registry.entries()]
           for registry in registries()}

  def listed(match):
    if match.group(1) not in names:
      raise ValueError(f"{page.file.src_path}: no registry '{match.group(1)}'")
    return ": " + ", ".join(f"`{name}`" for name in names[match.group(1)])

  return _REGISTRY_MARK.sub(listed, markdown)


def registries_page() -> str:
  """Markdown: one section per registry, one row per entry (name, parameters, summary)."""
  from fedsim.catalog import params_of, registries
  lines = [
      "# Registries",
      "",
      "Every name a config can pick, registry by registry: the same entries, parameters,",
      "types and defaults as `fedsim list` prints (this page is generated from",
      "`fedsim/catalog.py` when the site is built). `fedsim list REGISTRY` prints one",
      "registry; a plugin's entries appear there once it is loaded (`--plugin`).",
      "",
  ]
  for registry in registries():
    lines += [f"## {registry.name}", ""]
    if registry.kind != registry.name:
      lines += [f"Entries are {_cell(registry.kind)}s (`fedsim list {registry.name}`).", ""]
    lines += ["| name | parameters (type = default) | what |", "|---|---|---|"]
    for entry in registry.entries():
      params = ", ".join(f"`{param}`" for param in params_of(entry.params))
      lines.append(f"| `{entry.name}` | {params or '(no parameters)'} | {_cell(entry.summary)} |")
    lines.append("")
  return "\n".join(lines)


def config_page() -> str:
  """Markdown: every key of an experiment config, nested sections as dotted keys."""
  from fedsim.experiment.config.schema import ExperimentConfig
  lines = [
      "# Config keys",
      "",
      "Every top-level key of an experiment config and of its fixed sections, with its type,",
      "default and the comment the code gives it (generated from",
      "`fedsim/experiment/config/schema.py` when the site is built). A section that picks",
      "a registry entry (`data`, `model`, `algorithm`, `runtime`) takes `name` plus that",
      "entry's own keys: see [Registries](registries.md). How sections merge and what",
      "`variants` do: [Experiment configs](../start/configs.md).",
      "",
      "| key | type | default | meaning |",
      "|---|---|---|---|",
  ]
  lines += _rows(ExperimentConfig, None, "")
  return "\n".join(lines) + "\n"


def _rows(cls: type, defaults, prefix: str) -> list[str]:
  """Table rows of `cls`'s fields; `defaults`, an instance, overrides the class
  defaults (a section's default instance may differ from its class's)."""
  from fedsim.catalog import params_of
  from fedsim.config.plain import yaml_text
  comments = _field_comments(cls)
  hints = typing.get_type_hints(cls)
  params = {param.name: param for param in params_of(cls)}
  rows, nested = [], []
  for field in dataclasses.fields(cls):
    if not field.init:
      continue
    key, param = prefix + field.name, params[field.name]
    type_text = param.type
    default = param.default if defaults is None else yaml_text(getattr(defaults, field.name))
    inner = _dataclass_in(hints[field.name])
    if "registry" in field.metadata:
      registry = field.metadata["registry"].name
      type_text = f"entry of [{registry}](registries.md#{registry})"
      inner = None  # an entry's keys are its registry's, listed there
      chosen = getattr(defaults, field.name) if defaults is not None else (
          field.default_factory() if field.default_factory is not dataclasses.MISSING
          else field.default)
      default = None if chosen is dataclasses.MISSING else f"{{name: {chosen.name}}}"
    elif "parser" in field.metadata:
      type_text = {"aggregation": "list of aggregation stages",
                   "broadcast": "list of broadcast stages",
                   "compression": "encoder per direction: `broadcast`, `aggregation`",
                   }.get(field.name, type_text)
    elif inner is not None:
      value = field.default if defaults is None else getattr(defaults, field.name)
      if value is dataclasses.MISSING:
        value = field.default_factory()
      nested.append((inner, value, key + "."))
      type_text, default = ("section" if value is not None else "section, or null"), (
          None if value is not None else "null")
    note = comments.get(field.name) or (KEY_MEANINGS.get(field.name, "") if not prefix else "")
    if param.used_with:
      note = f"(only with {param.used_with}) {note}".strip()
    default_cell = "(required)" if default is None and inner is None else (
        f"`{default}`" if default is not None else "")
    rows.append(f"| `{key}` | {_cell(type_text)} | {default_cell} | {_cell(note)} |")
  for inner, value, inner_prefix in nested:
    rows += _rows(inner, value, inner_prefix)
  return rows


def _dataclass_in(tp) -> type | None:
  """The dataclass a field holds (also inside `X | None`), else None."""
  candidates = [tp]
  if typing.get_origin(tp) in (typing.Union, types.UnionType):
    candidates = typing.get_args(tp)
  for candidate in candidates:
    if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
      return candidate
  return None


def _field_comments(cls: type) -> dict[str, str]:
  """Each field's comment in the class source: the comment lines right above
  it and the one at the end of its line, joined."""
  lines = textwrap.dedent(inspect.getsource(cls)).splitlines()
  comments = {}
  for node in ast.parse("\n".join(lines)).body[0].body:
    if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
      continue
    above, row = [], node.lineno - 2
    while row >= 0 and lines[row].strip().startswith("#"):
      above.insert(0, lines[row].strip().lstrip("#").strip())
      row -= 1
    end = lines[node.end_lineno - 1]
    trailing = end.split("  # ", 1)[1].strip() if "  # " in end else ""
    comments[node.target.id] = " ".join(above + [trailing]).strip()
  return comments


def _cell(text: str) -> str:
  """Text for a table cell: a pipe outside code would end the cell."""
  parts = text.replace("\n", " ").split("`")
  return "`".join(part if i % 2 else part.replace("|", "\\|").replace("<", "&lt;")
                  for i, part in enumerate(parts))
