"""Checks documentation snippets in a process of their own (run by tests/docs).

    python snippet_runner.py yaml|python SNIPPETS.json RESULTS.json

SNIPPETS.json is a list of {"where", "page", "code", "file"}; RESULTS.json gets
{where: error line or null} for each. The working directory is the scratch
directory the snippets see (with `experiments/` and the pages' `file:` blocks).
A process of its own because plugins register names for good, and so that
TensorFlow is imported once for every Python snippet.
"""

from __future__ import annotations

import importlib
import io
import itertools
import json
import os
import pathlib
import sys
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[2]


def check_yaml(code: str) -> None:
  """Validates a config, or a fragment laid over the quickstart, as `fedsim validate`
  parses it (without its checks of this machine: data files, builders' imports)."""
  from fedsim.experiment.config import yaml_syntax
  from fedsim.experiment.config.loader import expand_variants, load_config, read_yaml
  from fedsim.experiment.config.merge import deep_merge
  data = yaml_syntax.load(io.StringIO(code))
  if not isinstance(data, dict):
    raise ValueError("not a mapping of config keys")
  if "name" not in data:
    base = read_yaml(ROOT / "experiments" / "quickstart.yaml")
    top = {key: data.pop(key) for key in ("plugins", "variants") if key in data}
    # As a variant is laid over its base (the rule `--set` and `variants` follow).
    data = {**deep_merge(base, top), "variants": {**top.get("variants", {}), "snippet": data}}
  _, raw = load_config(data)
  expand_variants(raw)


def run_python(snippets: list[dict]) -> dict[str, str | None]:
  """Runs each page's blocks in order in one fresh namespace; after a failure the
  page's later blocks are reported as not run."""
  results = {}
  for page, group in itertools.groupby(snippets, key=lambda s: s["page"]):
    namespace = {"__name__": "__main__"}
    failed = None
    for snippet in group:
      if failed:
        results[snippet["where"]] = f"not run: {failed} failed"
        continue
      try:
        if snippet["file"]:  # written by the test; importing it is running it
          importlib.import_module(snippet["file"].removesuffix(".py").replace("/", "."))
        else:
          exec(compile(snippet["code"], snippet["where"], "exec"), namespace)  # noqa: S102
        results[snippet["where"]] = None
      except BaseException as e:  # noqa: BLE001 -- a snippet may raise anything
        last = traceback.extract_tb(e.__traceback__)[-1]
        results[snippet["where"]] = f"{type(e).__name__}: {e} (at {last.filename}:{last.lineno})"
        failed = snippet["where"]
  return results


def main(kind: str, snippets_path: str, results_path: str) -> None:
  sys.path.insert(0, os.getcwd())  # the pages' `file:` modules, e.g. mylab.models
  snippets = json.loads(pathlib.Path(snippets_path).read_text())
  if kind == "yaml":
    results = {}
    for snippet in snippets:
      try:
        check_yaml(snippet["code"])
        results[snippet["where"]] = None
      except BaseException as e:  # noqa: BLE001 -- UserError, YAML errors, ...
        results[snippet["where"]] = f"{type(e).__name__}: {e}"
  else:
    results = run_python(snippets)
  pathlib.Path(results_path).write_text(json.dumps(results))


if __name__ == "__main__":
  main(*sys.argv[1:])
