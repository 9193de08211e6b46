"""Building a compiled round with and without TFF's own Grappler pass.

    uv run python bench/compile.py                        # W2 and W1, 30 rounds each
    uv run python bench/compile.py --workloads W2 --rounds 60

fedsim compiles each process to TFF's MapReduceForm (fedsim/backend/mapreduce.py)
with TFF's Grappler pass turned off: TensorFlow optimizes a graph again when the
runtime first calls it. This bench builds the `inprocess` round of each workload
(bench/workloads.py) twice in one process, once as TFF would by default
(aggressive Grappler) and once as fedsim does, and prints the build's CPU time,
the largest difference between the two rounds' results over the timed rounds,
and the median round time of each, the two alternating round by round so both
see the same load (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

import workloads  # noqa: E402  (bench/workloads.py)
from fedsim.backend import mapreduce  # noqa: E402
from fedsim.experiment.round_clients import pack_client  # noqa: E402
from fedsim.runtime import inprocess  # noqa: E402

# TFF 0.87's default: what get_map_reduce_form_for_computation runs when not told.
TFF_DEFAULT = tff.backends.mapreduce.get_map_reduce_form_for_computation.__defaults__[0]


def _build(process, tff_grappler: bool):
  """(the InProcessProcess, CPU seconds its build took: MapReduceForm, init, graphs)."""
  mapreduce._FORMS.pop(process, None)  # pylint: disable=protected-access
  config = TFF_DEFAULT if tff_grappler else mapreduce._NO_GRAPPLER  # pylint: disable=protected-access
  started = time.process_time()
  with mock.patch.object(mapreduce, "_NO_GRAPPLER", config):
    built = inprocess.InProcessProcess(process, "auto")
  return built, time.process_time() - started


def _leaves(state) -> list[np.ndarray]:
  return [np.asarray(v) for v in tff.structure.flatten(
      tff.structure.from_container(state, recursive=True))]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workloads", default="W2,W1")
  parser.add_argument("--rounds", type=int, default=30)
  parser.add_argument("--warmup", type=int, default=3)
  args = parser.parse_args()
  print(f"load average {os.getloadavg()[0]:.1f} at the start")
  print("| workload | build CPU s, TFF's Grappler | build CPU s, fedsim | max abs diff |"
        " round ms, TFF's Grappler | round ms, fedsim | ratio |")
  print("|---|---|---|---|---|---|---|")
  for name in args.workloads.split(","):
    work = workloads.Workload(name)
    packed = [pack_client(work.sim, 1, c) for c in work.clients(10)]
    runs, built = {}, {}
    for tff_grappler in (True, False):
      process, seconds = _build(work.sim.algorithm.process, tff_grappler)
      runs[tff_grappler] = [process, process.initialize()]
      built[tff_grappler] = seconds
    times: dict[bool, list[float]] = {True: [], False: []}
    diff = 0.0
    for i in range(args.warmup + args.rounds):
      for tff_grappler in ((True, False) if i % 2 else (False, True)):
        process, state = runs[tff_grappler]
        started = time.perf_counter()
        runs[tff_grappler][1], _ = process.next(state, packed)
        if i >= args.warmup:
          times[tff_grappler].append(time.perf_counter() - started)
      diff = max(diff, max(float(np.max(np.abs(a - b))) for a, b in zip(
          _leaves(runs[True][1]), _leaves(runs[False][1]), strict=True)))
    before, after = (1000 * statistics.median(times[k]) for k in (True, False))
    print(f"| {name} | {built[True]:.2f} | {built[False]:.2f} | {diff:.1e} | {before:.1f} |"
          f" {after:.1f} | {after / before:.2f}x |", flush=True)
  print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
  main()
