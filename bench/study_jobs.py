"""Wall time of a study of 8 quickstart-sized runs: `--jobs 2` and the Ray
executor against sequential.

Usage: uv run python bench/study_jobs.py [--rounds R] [--repeats N] [--modes M,M]

Plays `experiments/quickstart.yaml` at seeds 0-7 (8 runs, `rounds` each) as
one `fedsim run` process per mode: `sequential`, `jobs2` (`--jobs 2`) and
`ray` (`--executor ray`, a local Ray instance started and stopped by the
study), interleaved (the order rotates each repeat) so that the machine's
load falls on all alike; prints each wall time with the load before it, then
per mode the median ratio of sequential's wall time to its own, and for
`ray` the median overhead per run against `--jobs N`, N this process's CPUs:
a local Ray instance plays as many runs at once, so the difference is what
Ray costs (its start, a task and a process per run):
(ray - jobsN) x N / 8 seconds of one of the N slots. Checks that every mode
logged the sequential study's metrics (bar the wall-clock column).
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


RUNS = 8
CPUS = len(os.sched_getaffinity(0))
MODES = {"sequential": [], "jobs2": ["--jobs", "2"], f"jobs{CPUS}": ["--jobs", str(CPUS)],
         "ray": ["--executor", "ray"]}


def _study(logdir: pathlib.Path, rounds: int, mode: str) -> float:
  args = [sys.executable, "-m", "fedsim.cli", "run", str(CONFIG),
          "--seeds", ",".join(map(str, range(RUNS))), "--set", f"rounds={rounds}",
          "--logdir", str(logdir), "--no-progress", *MODES[mode]]
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
  parser.add_argument("--modes", default="sequential,jobs2,ray",
                      help=f"comma-separated, among {', '.join(MODES)}"
                           f" (ray brings jobs{CPUS} along)")
  args = parser.parse_args()
  modes = ["sequential"] + [m for m in args.modes.split(",") if m != "sequential"]
  if "ray" in modes and f"jobs{CPUS}" not in modes:
    modes.insert(modes.index("ray"), f"jobs{CPUS}")
  unknown = [m for m in modes if m not in MODES]
  if unknown:
    parser.error(f"--modes: unknown {', '.join(unknown)}; choose among {', '.join(MODES)}")
  times = {mode: [] for mode in modes}
  with tempfile.TemporaryDirectory() as tmp:
    for repeat in range(args.repeats):
      shift = repeat % len(modes)
      for mode in modes[shift:] + modes[:shift]:
        load = os.getloadavg()[0]
        logdir = pathlib.Path(tmp) / f"r{repeat}-{mode}"
        seconds = _study(logdir, args.rounds, mode)
        times[mode].append(seconds)
        print(f"repeat {repeat} {mode}: {seconds:.1f} s (load before {load:.2f})", flush=True)
    want = _metrics(pathlib.Path(tmp) / "r0-sequential" / "quickstart")
    same = {mode: _metrics(pathlib.Path(tmp) / f"r0-{mode}" / "quickstart") == want
            for mode in modes[1:]}
  for mode in modes[1:]:
    ratio = statistics.median(a / b for a, b in zip(times["sequential"], times[mode]))
    line = (f"{RUNS} runs x {args.rounds} rounds on {CPUS} CPUs:"
            f" sequential / {mode} wall time, median of {args.repeats}: {ratio:.2f}x")
    if mode == "ray":
      overhead = statistics.median((r - j) * CPUS / RUNS
                                   for j, r in zip(times[f"jobs{CPUS}"], times[mode]))
      line += f"; overhead per run against --jobs {CPUS}: {overhead:.1f} s"
    print(f"{line}; same metrics: {same[mode]}")


if __name__ == "__main__":
  main()
