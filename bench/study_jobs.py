"""Wall time of a study of 8 quickstart-sized runs: `--jobs 2` against sequential.

Usage: uv run python bench/study_jobs.py [--rounds R] [--repeats N]

Plays `experiments/quickstart.yaml` at seeds 0-7 (8 runs, `rounds` each) as
one `fedsim run` process, sequentially and with `--jobs 2`, alternating the
two `repeats` times so that the machine's load falls on both alike; prints
each wall time, the load before each, and the median ratio. Checks that both
studies logged the same metrics (bar the wall-clock column).
"""

from __future__ import annotations

import argparse
import csv
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = REPO / "experiments" / "quickstart.yaml"


def _study(logdir: pathlib.Path, rounds: int, jobs: int) -> float:
  args = [sys.executable, "-m", "fedsim.cli", "run", str(CONFIG), "--seeds", "0,1,2,3,4,5,6,7",
          "--set", f"rounds={rounds}", "--logdir", str(logdir), "--no-progress",
          "--jobs", str(jobs)]
  start = time.monotonic()
  subprocess.run(args, check=True, stdout=subprocess.DEVNULL,
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  return time.monotonic() - start


def _metrics(study: pathlib.Path) -> dict[str, list[dict[str, str]]]:
  out = {}
  for run in sorted(study.glob("seed*/metrics.csv")):
    with open(run, newline="") as f:
      out[run.parent.name] = [{k: v for k, v in row.items() if k != "round_seconds"}
                              for row in csv.DictReader(f)]
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args()
  times = {1: [], 2: []}
  with tempfile.TemporaryDirectory() as tmp:
    for repeat in range(args.repeats):
      for jobs in (1, 2) if repeat % 2 == 0 else (2, 1):
        load = os.getloadavg()[0]
        logdir = pathlib.Path(tmp) / f"r{repeat}-j{jobs}"
        seconds = _study(logdir, args.rounds, jobs)
        times[jobs].append(seconds)
        print(f"repeat {repeat} jobs {jobs}: {seconds:.1f} s (load before {load:.2f})",
              flush=True)
    same = _metrics(pathlib.Path(tmp) / "r0-j1" / "quickstart") == _metrics(
        pathlib.Path(tmp) / "r0-j2" / "quickstart")
  ratio = statistics.median(a / b for a, b in zip(times[1], times[2]))
  print(f"8 runs x {args.rounds} rounds on {len(os.sched_getaffinity(0))} CPUs: sequential /"
        f" --jobs 2 wall time, median of {args.repeats}: {ratio:.2f}x;"
        f" same metrics: {same}")


if __name__ == "__main__":
  main()
