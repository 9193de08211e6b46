"""fedsim's layers import downward: the base depends on nothing else in fedsim,
and no two packages import each other (module-level imports only; an import
inside a function is how a layer reaches a plugin point lazily)."""

from __future__ import annotations

import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fedsim"
# Registries, typed config, errors, random streams, and the task and algorithm types.
BASE = {"fedsim.errors", "fedsim.registry", "fedsim.task", "fedsim.config", "fedsim.seeds"}


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in ROOT.rglob("*.py"):
    name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    out[name.removesuffix(".__init__")] = path
  return out


def _package(module: str) -> str:
  return ".".join(module.split(".")[:2])


def _imports() -> dict[str, set[str]]:
  modules = _modules()
  graph = collections.defaultdict(set)
  for name, path in modules.items():
    for node in ast.parse(path.read_text()).body:
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
      else:
        continue
      graph[name].update(t for t in targets if t in modules and t != name)
  return graph


def test_the_base_imports_nothing_above_it():
  climbing = sorted(f"{module} -> {target}" for module, targets in _imports().items()
                    if _package(module) in BASE for target in targets
                    if _package(target) not in BASE)
  assert climbing == []


def test_no_two_packages_import_each_other():
  packages = collections.defaultdict(set)
  for module, targets in _imports().items():
    for target in targets:
      if _package(module) != _package(target):
        packages[_package(module)].add(_package(target))
  pairs = sorted({tuple(sorted((a, b))) for a, bs in packages.items() for b in bs
                  if a in packages.get(b, ())})
  assert pairs == []
