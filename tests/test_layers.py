"""fedsim's layers import downward: a package imports only from its own layer
or below, and no two packages import each other. Imports inside functions
count like module-level ones: they defer an import (TensorFlow's, a plugin
point's), they do not license climbing."""

from __future__ import annotations

import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fedsim"
# Bottom to top: a package may import its own layer and those below it.
LAYERS = (
    # Registries, typed config, errors, random streams, metric names, the task and algorithm types.
    {"fedsim.errors", "fedsim.registry", "fedsim.task", "fedsim.config", "fedsim.seeds",
     "fedsim.metric_names", "fedsim.control", "fedsim.invocation"},
    {"fedsim.data", "fedsim.models", "fedsim.compression", "fedsim.backend", "fedsim.plugins",
     "fedsim.system"},  # system: the simulated devices, links and clock
    {"fedsim.aggregation", "fedsim.sizing"},  # stages over encoders; bits of a compiled round
    {"fedsim.learning"},  # client work, stages and composition
    {"fedsim.algorithms", "fedsim.runtime"},
    {"fedsim.reporting"},
    {"fedsim.state"},  # checkpoints and client states in a run directory
    {"fedsim.experiment"},
    # The API, and what `fedsim list`, `fedsim status` and `fedsim data describe` print.
    {"fedsim.api", "fedsim.catalog", "fedsim.host_limits", "fedsim.run_status",
     "fedsim.describe_data"},
    {"fedsim.study"},  # a study's runs (variants x seeds), each run through the API
    {"fedsim.cli", "fedsim"},
)
LAYER = {package: i for i, layer in enumerate(LAYERS) for package in layer}


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in ROOT.rglob("*.py"):
    name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    out[name.removesuffix(".__init__")] = path
  return out


def _package(module: str) -> str:
  return ".".join(module.split(".")[:2])


def _imported(tree: ast.AST, modules) -> set[tuple[str, int]]:
  """(fedsim module, line) of every import in `tree`, at any depth."""
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      # `from fedsim import api` imports fedsim.api; `from fedsim.data import X`, fedsim.data.
      targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                 else node.module for a in node.names]
    else:
      continue
    found.update((t, node.lineno) for t in targets if t in modules)
  return found


def test_every_package_has_a_layer():
  assert {_package(m) for m in _modules()} - set(LAYER) == set()


def test_imports_go_down():
  modules = _modules()
  climbing = sorted(
      f"{name}:{line} -> {target}" for name, path in modules.items()
      for target, line in _imported(ast.parse(path.read_text()), modules)
      if LAYER[_package(target)] > LAYER[_package(name)])
  assert climbing == []


def test_no_two_packages_import_each_other():
  modules = _modules()
  packages = collections.defaultdict(set)
  for name, path in modules.items():
    for target, _ in _imported(ast.parse(path.read_text()), modules):
      if _package(name) != _package(target):
        packages[_package(name)].add(_package(target))
  pairs = sorted({tuple(sorted((a, b))) for a, bs in packages.items() for b in bs
                  if a in packages.get(b, ())})
  assert pairs == []


def test_an_import_inside_a_function_is_seen():
  tree = ast.parse("import os\ndef f():\n  if True:\n    from fedsim.experiment import loop, X\n")
  assert _imported(tree, {"fedsim.experiment", "fedsim.experiment.loop"}) == {
      ("fedsim.experiment", 4), ("fedsim.experiment.loop", 4)}


def test_no_two_modules_share_a_file_name():
  """Two modules with one file name are two concepts wearing one name, or one concept
  in two places: rename or merge (one concept per module, one home per concept)."""
  names = collections.Counter(p.name for p in ROOT.rglob("*.py") if p.name != "__init__.py")
  assert {n for n, count in names.items() if count > 1} == set()
