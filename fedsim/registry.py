"""Name -> builder registries for models, datasets, algorithms, encoders...

Each entry carries a frozen dataclass of typed parameters; the config refers
to entries by name and the config parser validates the remaining keys of the
section against that dataclass. Modules that register entries must not import
TensorFlow at module level, so that `fedsim validate` stays fast: heavy
imports go inside the builder.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import os
import pathlib
import sys
import types
from typing import Any, Callable, Generic, Mapping, TypeVar

from fedsim.errors import UserError, one_line


@dataclasses.dataclass(frozen=True)
class NoParams:
  """Parameters of an entry that takes none."""


F = TypeVar("F", bound=Callable[..., Any])

# Every registry created, in creation order (what `fedsim list` shows).
REGISTRIES: list[Registry] = []


@dataclasses.dataclass(frozen=True)
class Entry:
  name: str
  build: Callable[..., Any]
  params: type
  summary: str
  # What else the registry needs to know of the entry, by the names the
  # registry declares (e.g. an aggregation stage's role): all of them, defaults filled.
  traits: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))


def closest(name: str, options) -> str:
  """' (did you mean 'x'?)' for the closest option, or '' when none is close."""
  match = difflib.get_close_matches(str(name), list(options), n=1, cutoff=0.6)
  return f" (did you mean '{match[0]}'?)" if match else ""


class Registry(Generic[F]):
  """A named collection of builders, each with its own parameter dataclass."""

  def __init__(self, kind: str, name: str | None = None,
               traits: Mapping[str, Any] | None = None):
    """`kind` names an entry in messages ('unknown aggregation stage ...');
    `name`, one word, is what `fedsim list` prints and is asked for (default:
    the first word of `kind`, so 'aggregation stage' is listed as 'aggregation');
    `traits` declares what an entry may state besides its builder and
    parameters, each name with its default."""
    self.kind = kind
    self.name = name or kind.split()[0]
    self.traits = types.MappingProxyType(dict(traits or {}))
    self._entries: dict[str, Entry] = {}
    REGISTRIES.append(self)

  def register(self, name: str, params: type = NoParams, replace: bool = False,
               traits: Mapping[str, Any] | None = None) -> Callable[[F], F]:
    """Decorator: registers `fn` under `name` with parameter class `params` and
    `traits` (names this registry declares; the others keep their defaults).

    Raises:
      TypeError: `params` is not a dataclass, or a trait is not declared.
      ValueError: `name` is taken, unless `replace` (e.g. a notebook cell
        that is run again).
    """
    if not dataclasses.is_dataclass(params):
      raise TypeError(f"params of {self.kind} '{name}' must be a dataclass")
    undeclared = sorted(set(traits or {}) - set(self.traits))
    if undeclared:
      raise TypeError(f"{self.kind} '{name}': unknown trait {', '.join(undeclared)};"
                      f" a {self.kind} declares: {', '.join(self.traits) or 'none'}")
    declared = types.MappingProxyType({**self.traits, **(traits or {})})

    def decorator(fn: F) -> F:
      if name in self._entries and self._entries[name].build is not fn and not replace:
        raise ValueError(f"{self.kind} '{name}' is already registered")
      summary = (fn.__doc__ or "").strip().splitlines()
      self._entries[name] = Entry(name, fn, params, summary[0] if summary else "", declared)
      return fn

    return decorator

  def get(self, name: str, key: str | None = None) -> Entry:
    """The entry for `name`; UserError naming `key` and the closest name if unknown."""
    try:
      return self._entries[name]
    except (KeyError, TypeError):
      where = f"{key}: " if key else ""
      raise UserError(
          f"{where}unknown {self.kind} '{name}'{closest(name, self._entries)};"
          f" choose one of: {', '.join(sorted(self._entries))}"
      ) from None

  def names(self) -> list[str]:
    return sorted(self._entries)

  def entries(self) -> list[Entry]:
    """The entries, sorted by name."""
    return [self._entries[name] for name in self.names()]

  def __contains__(self, name: str) -> bool:
    return name in self._entries


def resolve(path: str, *, key: str) -> Any:
  """The callable at "package.module:function" (a config's `builder:` key); the
  working directory is importable. Used wherever a config names user code; a
  module that is also a `plugins:` file is that plugin, not imported twice.

  Raises:
    UserError: naming `{key}.builder` when the module or function is missing,
      or when importing the module raised (one line, no traceback).
  """
  module_name, _, attr = path.partition(":")
  if "" not in sys.path:  # `python -m` and console scripts differ here; make them agree
    sys.path.insert(0, "")
  try:
    module = import_module(module_name)
  except ImportError as e:
    raise UserError(f"{key}.builder: cannot import module '{module_name}' ({e})") from None
  except Exception as e:  # the user's module failed while importing: their input, not a bug
    raise UserError(f"{key}.builder: importing '{module_name}' raised {one_line(e)}") from None
  fn = module
  for part in attr.split("."):
    fn = getattr(fn, part, None)
  if not callable(fn):
    raise UserError(f"{key}.builder: module '{module_name}' has no function '{attr}'")
  return fn


def import_module(name: str) -> types.ModuleType:
  """`importlib.import_module(name)`, except that a file already imported under
  another name (a `plugins:` file) is that module, not run a second time: its
  registrations would fail as 'already registered'."""
  if name in sys.modules:
    return sys.modules[name]
  try:
    spec = importlib.util.find_spec(name)
  except (ImportError, ValueError):  # import_module below reports it
    spec = None
  module = loaded_from(spec.origin) if spec is not None and spec.origin else None
  if module is None:
    return importlib.import_module(name)
  sys.modules[name] = module  # so the user's own `import name` gets it too
  return module


def loaded_from(path: str | os.PathLike) -> types.ModuleType | None:
  """The module already imported from file `path`, under whichever name."""
  path = pathlib.Path(path).resolve()
  for module in list(sys.modules.values()):
    file = getattr(module, "__file__", None)
    # Comparing base names first keeps this cheap with thousands of modules loaded.
    if (isinstance(file, str) and os.path.basename(file) == path.name
        and pathlib.Path(file).resolve() == path):
      return module
  return None
