"""Where the time from `fedsim run` to its first round goes.

    uv run python bench/startup.py [--repeat N] [--before REV] [CONFIG] [--set KEY=VALUE ...]

Runs CONFIG (default experiments/quickstart.yaml on `inprocess`, 1 round)
through `fedsim.run` in a child process, N times (default 2), with the
start-up steps of `fedsim.run` and `build_simulation` wrapped in timers, and
prints one line per step in seconds (the median of the children): Python and
fedsim's imports with the config, TF/TFF import, data, model, algorithm (TFF
tracing), sizing (MapReduceForm compiles), the round process (graph import),
the evaluator, then the first round (first graph call: tracing and Grappler)
and the whole child from its first line to the end of round 1.

--before REV also times fedsim as it was at git revision REV (its `fedsim/`
extracted to a temporary directory, first on the children's PYTHONPATH; the
rest of the environment is this one), its children alternating with this
tree's so that both see the same load, and prints the two columns side by side.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

DEFAULT = ["experiments/quickstart.yaml", "--set", "rounds=1", "--set", "runtime.name=inprocess"]
STEPS = [("fedsim.backend.quiet", "import_tff", "TF + TFF import"),
         ("fedsim.experiment.simulation", "_training_data", "data"),
         ("fedsim.experiment.simulation", "_task_model", "model (Keras + TFF functional)"),
         ("fedsim.experiment.simulation", "_build_algorithm", "algorithm (TFF tracing)"),
         ("fedsim.experiment.simulation", "_wire_bits", "sizing (MapReduceForm compile)"),
         ("fedsim.experiment.simulation", "_round_process", "round process (graph import)"),
         ("fedsim.experiment.simulation", "make_evaluator", "evaluator")]


def child(argv) -> None:
  """Runs the config with timers around STEPS; prints one JSON line of seconds."""
  import importlib
  config, overrides = argv[0], [a for a in argv[1:] if a != "--set"]
  import fedsim
  from fedsim.experiment.config.loader import load_config
  load_config(config, overrides)
  times = {"Python, fedsim imports, config": time.perf_counter() - STARTED}
  for _, _, label in STEPS:
    times[label] = 0.0
  times["fedsim's TF modules import"] = 0.0
  marks = {}
  quiet = importlib.import_module("fedsim.backend.quiet")
  import_tff = quiet.import_tff

  def timed_import(*args, **kwargs):
    start = time.perf_counter()
    module = import_tff(*args, **kwargs)
    middle = time.perf_counter()
    times["TF + TFF import"] += middle - start
    if marks.setdefault("wrapped", False):
      return module  # later calls (fedsim's modules call it too) must not wrap twice
    marks["wrapped"] = True
    for module_name, function, label in STEPS[1:]:  # importing them imports TF
      _wrap(module_name, function, label, times, importlib)
    loop = importlib.import_module("fedsim.experiment.loop")
    run_rounds = loop.run_rounds

    def timed_rounds(*args, **kwargs):
      marks["rounds"] = time.perf_counter()
      return run_rounds(*args, **kwargs)

    loop.run_rounds = timed_rounds
    times["fedsim's TF modules import"] += time.perf_counter() - middle
    return module

  quiet.import_tff = timed_import

  def on_round(round_num, metrics, info):
    marks.setdefault("first", time.perf_counter())

  with tempfile.TemporaryDirectory() as logdir:
    fedsim.run(config, overrides, logdir=logdir, progress=False, on_round=on_round)
  times["first round (tracing, Grappler, evaluation)"] = marks["first"] - marks["rounds"]
  times["total to the end of round 1"] = marks["first"] - STARTED
  print(json.dumps(times))


def _wrap(module_name, function, label, times, importlib) -> None:
  module = importlib.import_module(module_name)
  original = getattr(module, function)

  def timed(*args, **kwargs):
    start = time.perf_counter()
    try:
      return original(*args, **kwargs)
    finally:
      times[label] += time.perf_counter() - start

  setattr(module, function, timed)


def main(argv) -> int:
  repeat, before, args = _options(argv)
  trees = {"now": None}
  with tempfile.TemporaryDirectory() as scratch:
    if before:
      trees = {f"at {before}": _extract(before, scratch), **trees}
    runs = {label: [] for label in trees}
    for _ in range(repeat):
      for label, tree in trees.items():  # alternating: both see the same load
        out = _child(args, tree)
        if out is None:
          return 1
        runs[label].append(out)
  print(f"start-up of `fedsim run {' '.join(args)}` (median of {repeat} processes each,"
        " seconds):")
  labels = list(runs["now"][0])
  print(f"  {'':48s} " + " ".join(f"{label:>12s}" for label in runs))
  for step in labels:
    cells = [statistics.median(r.get(step, 0.0) for r in column) for column in runs.values()]
    print(f"  {step:48s} " + " ".join(f"{cell:12.2f}" for cell in cells))
  return 0


def _options(argv) -> tuple[int, str | None, list[str]]:
  repeat, before, rest = 2, None, []
  argv = list(argv)
  while argv:
    arg = argv.pop(0)
    if arg in ("--repeat", "--before") and argv:
      value = argv.pop(0)
      if arg == "--repeat":
        repeat = max(1, int(value))
      else:
        before = value
    else:
      rest.append(arg)
  return repeat, before, rest or DEFAULT


def _extract(revision: str, scratch: str) -> str:
  """Writes `fedsim/` as of `revision` under `scratch`; returns the directory."""
  tree = os.path.join(scratch, "before")
  os.makedirs(tree)
  archive = subprocess.run(["git", "archive", revision, "fedsim"], capture_output=True,
                           check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
  return tree


def _child(args, tree: str | None) -> dict | None:
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
  if tree:
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
  out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True,
                       text=True, check=False, env=env)
  if out.returncode != 0:
    print(out.stderr[-3000:], file=sys.stderr)
    return None
  return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
  if sys.argv[1:2] == ["--child"]:
    child(sys.argv[2:])
  elif {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)
  else:
    sys.exit(main(sys.argv[1:]))
