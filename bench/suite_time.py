"""The test suite's wall time against a reference commit's, on this host.

Hosts of one machine kind differ by up to twice in speed, so an absolute time
says little about the code: this clones the reference (`--reference`, default
0bd49c7, the code that ran in 8 min 42 s on the first host, quiet) and the
current tree's HEAD into a scratch directory, installs each (`uv sync`), and
runs their `uv run pytest` one after the other, alternating, `--repeat` times
each, with a loop of 10^7 additions timed before each run as a gauge of the
host. It prints each run and the ratio of the means, current / reference.
Nothing else should run meanwhile (two cores: a run is CPU-bound). ~25 minutes
a pair on a slow host.

  uv run python bench/suite_time.py --repeat 2
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
# The code measured at 8 min 42 s (and 8 min 44 s) on the first host, quiet;
# docs/explain/development.md.
REFERENCE = "0bd49c7"
REFERENCE_SECONDS = 8 * 60 + 42


def _loop_seconds() -> float:
  start, total = time.perf_counter(), 0
  for i in range(10**7):
    total += i
  return time.perf_counter() - start


def _checkout(rev: str, into: pathlib.Path) -> pathlib.Path:
  subprocess.run(["git", "clone", "-q", str(REPO), str(into)], check=True)
  subprocess.run(["git", "-C", str(into), "checkout", "-q", rev], check=True)
  subprocess.run(["uv", "sync", "-q"], cwd=into, check=True)
  return into


def _suite(tree: pathlib.Path, select: list[str]) -> tuple[float, float, str]:
  """(wall seconds, children's user CPU seconds, pytest's last line)."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
  start = time.monotonic()
  done = subprocess.run(["uv", "run", "pytest", "-p", "no:cacheprovider", "-q", *select], cwd=tree,
                        capture_output=True, text=True, check=False)
  wall = time.monotonic() - start
  user = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before
  lines = done.stdout.strip().splitlines()
  return wall, user, lines[-1] if lines else f"exit {done.returncode}"


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reference", default=REFERENCE, help="the commit to compare with")
  parser.add_argument("--repeat", type=int, default=2, help="runs of each, alternating")
  parser.add_argument("select", nargs="*",
                      help="pytest arguments (default: none, the whole default run)")
  args = parser.parse_args(argv)
  head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                        capture_output=True, text=True, check=True).stdout.strip()
  walls: dict[str, list[float]] = {args.reference: [], head: []}
  with tempfile.TemporaryDirectory(prefix="fedsim-suite-") as scratch:
    trees = {rev: _checkout(rev, pathlib.Path(scratch) / rev) for rev in walls}
    for _ in range(args.repeat):
      for rev, tree in trees.items():
        gauge = _loop_seconds()
        wall, user, last = _suite(tree, args.select)
        walls[rev].append(wall)
        print(f"{rev}: {wall:7.1f} s wall, {user:7.1f} s user CPU (10^7-additions loop"
              f" {gauge:.2f} s before): {last}", flush=True)
  ratio = statistics.mean(walls[head]) / statistics.mean(walls[args.reference])
  print(f"{head} / {args.reference}: {ratio:.3f} of the reference's wall time")
  if args.reference == REFERENCE and not args.select:
    estimate = ratio * REFERENCE_SECONDS
    print(f"on the host where {REFERENCE} took 8 min 42 s: ~{estimate // 60:.0f} min"
          f" {estimate % 60:.0f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
