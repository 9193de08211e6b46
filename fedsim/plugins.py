"""Plugins: user modules imported before a config is validated.

A plugin is ordinary Python that registers entries in fedsim's registries
(models, encoders, algorithms, datasets, optimizers, partitioners, ...), so
that a config can name them. It is named either as a module
(`mylab.models`, imported with the config's directory and the working
directory on `sys.path`) or as a `.py` file relative to the config's
directory (`./my_plugin.py`).

A plugin file may be anywhere: relative to the config's directory (`../x.py`
leaves it, as a script's imports may), absolute, or under `~`. A config is as
trusted as the code it names, like a Makefile; what is refused is a file that
is not Python (`/etc/passwd`): a `.py` file is required.

A file is imported under a module name derived from its absolute path, so
naming it again (another config, `--plugin` and `plugins:` together, a
notebook cell run twice) reuses the module instead of registering its
entries a second time. The same holds across the two ways of naming a file:
a `plugins:` file and a `builder: "module:fn"` (or module plugin) whose
module is that file are one module (see `fedsim.registry.import_module`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import pathlib
import re
import sys
import types
from typing import Any

from fedsim.errors import UserError, one_line  # one_line: also imported from here
from fedsim.registry import import_module, loaded_from


def is_file_plugin(spec: str) -> bool:
  """Whether `spec` names a `.py` file (else a module to import by name)."""
  return spec.endswith(".py") or "/" in spec or os.sep in spec


def load_plugins(specs: Any, base_dir: str | os.PathLike, *,
                 key: str = "plugins") -> list[types.ModuleType]:
  """Imports each plugin of `specs`, in order.

  Args:
    specs: a list of module names or `.py` paths (None: no plugins).
    base_dir: what relative `.py` paths are relative to; also put on
      `sys.path` (with the working directory) for module plugins.
    key: how errors name the list: `plugins` gives `plugins[0]: ...`, and
      `--plugin` gives `--plugin X: ...`.

  Returns:
    The imported modules.

  Raises:
    UserError: one line naming the plugin and its error (exception type and
      message; no traceback), e.g. `plugins[0]: ./p.py: ModuleNotFoundError:
      No module named 'foo'`.
  """
  if specs is None:
    return []
  if not isinstance(specs, (list, tuple)) or not all(isinstance(s, str) and s for s in specs):
    raise UserError(f"{key}: expected a list of module names or .py files, got {specs!r:.60}")
  modules = []
  for i, spec in enumerate(specs):
    where = f"{key} {spec}" if key.startswith("--") else f"{key}[{i}]: {spec}"
    modules.append(load_plugin(spec, base_dir, where=where))
  return modules


def load_plugin(spec: str, base_dir: str | os.PathLike, *, where: str) -> types.ModuleType:
  """Imports one plugin (see `load_plugins`); `where` prefixes error messages."""
  base = pathlib.Path(base_dir).resolve()
  if is_file_plugin(spec):
    return _import_file(base / os.path.expanduser(spec), where)
  if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", spec):
    raise UserError(f"{where}: not a module name (dotted.name) or a .py file")
  for entry in (os.getcwd(), str(base)):
    if entry not in sys.path:
      # Prepended, as `python script.py` does for the script's directory; kept
      # after the import, since plugins may import their siblings lazily.
      sys.path.insert(0, entry)
  importlib.invalidate_caches()
  try:
    return import_module(spec)
  except Exception as e:  # the plugin's own error, reported in one line
    raise UserError(f"{where}: {one_line(e)}") from None


def module_name(path: pathlib.Path) -> str:
  """The stable `sys.modules` name of plugin file `path` (absolute)."""
  digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
  return f"fedsim_plugin_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"


def _import_file(path: pathlib.Path, where: str) -> types.ModuleType:
  path = path.resolve()
  name = module_name(path)
  if name in sys.modules:
    return sys.modules[name]
  if path.is_dir():
    raise UserError(f"{where}: {path} is a directory; name a .py file in it, or the package"
                    " as a module (its directory on PYTHONPATH)")
  if not path.is_file():
    raise UserError(f"{where}: file not found ({path})")
  if path.suffix != ".py":  # importlib finds no loader for it
    raise UserError(f"{where}: not a Python file (a plugin file ends in .py)")
  module = loaded_from(path)  # imported by module name (`--plugin`, a builder) before
  if module is not None:
    sys.modules[name] = module
    return module
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  # Registered before running, as an import would: dataclasses and
  # typing.get_type_hints look their module up in sys.modules.
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except Exception as e:
    del sys.modules[name]
    raise UserError(f"{where}: {one_line(e)}") from None
  return module


def absolute_plugins(specs: list[str], base_dir: str | os.PathLike) -> list[str]:
  """`specs` with each `.py` file as its absolute path (module names as they are)."""
  base = pathlib.Path(base_dir).resolve()
  return [str((base / os.path.expanduser(spec)).resolve()) if is_file_plugin(spec) else spec
          for spec in specs]


def plugin_dir(source: Any) -> pathlib.Path:
  """What a config's relative plugin paths are relative to: its file's directory, or cwd."""
  if isinstance(source, (str, os.PathLike)):
    return pathlib.Path(source).resolve().parent
  return pathlib.Path.cwd()
