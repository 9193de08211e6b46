"""Random streams: each id registered once in fedsim/seeds.py, and nowhere else."""

from __future__ import annotations

import ast
import collections
import pathlib
import re

from fedsim import seeds

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fedsim"
STREAM_NAME = re.compile(r"_(SUB)?STREAM$")
# experiment/simulation.py (the lead's, being rewritten) still takes PACK_STREAM
# through data/federated.py; when it imports fedsim.seeds, empty this and drop
# the re-export there.
REEXPORTED = set()


def _modules():
  for path in sorted(ROOT.rglob("*.py")):
    name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    yield name.removesuffix(".__init__"), ast.parse(path.read_text())


def test_stream_ids_are_unique_within_their_stream():
  ids = collections.defaultdict(list)
  for stream in seeds.STREAMS:
    ids[stream.parent, stream.id].append(stream.name)
  assert {key: names for key, names in ids.items() if len(names) > 1} == {}
  assert all(stream.parent in {s.name for s in seeds.STREAMS if s.parent is None}
             for stream in seeds.STREAMS if stream.parent)


def test_every_stream_constant_is_registered_under_its_name():
  constants = {name: getattr(seeds, name) for name in dir(seeds) if STREAM_NAME.search(name)}
  assert constants == {stream.name: stream.id for stream in seeds.STREAMS}
  assert all(stream.purpose for stream in seeds.STREAMS)


def test_the_device_model_no_longer_draws_the_holdout_stream():
  # The bug this module fixed: both were 7, so round r's device draws were client r's hold-out.
  assert seeds.SYSTEM_STREAM != seeds.HOLDOUT_STREAM


def _defined_outside(name: str, tree: ast.AST) -> list[str]:
  found = []
  for node in ast.walk(tree):
    targets = (node.targets if isinstance(node, ast.Assign)
               else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
    for target in targets:
      for leaf in ast.walk(target):
        if isinstance(leaf, ast.Name) and STREAM_NAME.search(leaf.id):
          found.append(f"{name}:{node.lineno} assigns {leaf.id}")
    # An inline id: default_rng([seed, 7, ...]) or SeedSequence([seed, 7, ...]).
    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.List)
        and len(node.args[0].elts) > 1 and isinstance(node.args[0].elts[1], ast.Constant)
        and getattr(node.func, "attr", getattr(node.func, "id", "")) in
        ("default_rng", "SeedSequence")):
      found.append(f"{name}:{node.lineno} draws from a literal stream id")
  return found


def test_no_module_but_seeds_defines_or_inlines_a_stream_id():
  found = [line for name, tree in _modules() if name != "fedsim.seeds"
           for line in _defined_outside(name, tree)]
  assert found == []


def test_the_scan_sees_a_stream_defined_elsewhere():
  tree = ast.parse("X_STREAM = 7\nrng = np.random.default_rng([seed, 7, r])\n"
                   "def f():\n  Y_SUBSTREAM: int = 1\n")
  assert sorted(_defined_outside("m", tree)) == [
      "m:1 assigns X_STREAM", "m:2 draws from a literal stream id", "m:4 assigns Y_SUBSTREAM"]


def test_stream_ids_are_imported_from_seeds():
  imported = {(name, node.module, alias.name) for name, tree in _modules()
              for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
              for alias in node.names if STREAM_NAME.search(alias.name)}
  assert {entry for entry in imported if entry[1] != "fedsim.seeds"} == REEXPORTED
