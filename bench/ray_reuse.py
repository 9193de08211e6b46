"""Small `ray` runs one after another in one process: cold (actors started per run) vs warm.

    flock /tmp/heavy.lock uv run python bench/ray_reuse.py [--runs 4] [--repeats 2]
        [--targets local,cluster]

Each run is tests/runtime/test_cluster.py's CONFIG (FedAvg, logistic regression
on `digits`, 2 rounds of 4 clients) played by `fedsim.run` on `runtime: {name:
ray, workers: 2, cpus_per_worker: 1, device: cpu}`, on a private instance
(`address: local`) and on a two-node loopback cluster of one CPU per node
(started as tests/ray_cluster.py starts it). Per target and repeat: one cold run
(`keep_workers: false` with nothing in the pool: the connection, both actors'
start-up and their teardown, as every run paid before actors were kept), then
`--runs` runs with `keep_workers: true` (the first starts the actors, the others
lease them), then `fedsim.runtime.cluster.release()`. Cold and warm runs
alternate, so load from others slows both alike; the ratio of their medians is
the figure. The machine's load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fedsim  # noqa: E402
from fedsim.runtime import cluster  # noqa: E402
from tests.ray_cluster import loopback_cluster  # noqa: E402
from tests.runtime.test_cluster import CONFIG  # noqa: E402


def timed_run(address: str, keep: bool, logdir: str) -> float:
  config = {**CONFIG, "runtime": {"name": "ray", "address": address, "workers": 2,
                                  "cpus_per_worker": 1, "device": "cpu", "keep_workers": keep}}
  begin = time.perf_counter()
  fedsim.run(config, logdir=logdir, progress=False)
  return time.perf_counter() - begin


def bench(address: str, label: str, runs: int, repeats: int, logdir: str) -> dict:
  cold, first, warm = [], [], []
  for repeat in range(repeats):
    cold.append(timed_run(address, False, logdir))
    block = [timed_run(address, True, logdir) for _ in range(runs)]
    cluster.release()
    first.append(block[0])
    warm += block[1:]
    print(f"  {label} repeat {repeat + 1}: cold {cold[-1]:.1f} s; warm block"
          f" {', '.join(f'{t:.1f}' for t in block)} s", flush=True)
  row = {"target": label, "cold_s": statistics.median(cold),
         "first_kept_s": statistics.median(first), "warm_s": statistics.median(warm)}
  row["ratio"] = row["cold_s"] / row["warm_s"]
  return row


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--runs", type=int, default=4, help="runs per warm block (>= 2)")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--targets", default="local,cluster")
  args = parser.parse_args()
  if args.runs < 2:
    parser.error("--runs: at least 2 (the first of a block starts the actors)")
  print(f"load before: {os.getloadavg()}", flush=True)
  rows = []
  with tempfile.TemporaryDirectory(prefix="fsbench_runs") as logdir:
    for target in args.targets.split(","):
      if target == "local":
        rows.append(bench("local", "local", args.runs, args.repeats, logdir))
      elif target == "cluster":
        with loopback_cluster() as (address, _, _):
          rows.append(bench(address, "cluster", args.runs, args.repeats, logdir))
      else:
        parser.error(f"--targets: unknown target '{target}' (local, cluster)")
  print(f"load after: {os.getloadavg()}")
  print("| target | cold run s | first kept run s | warm run s | cold / warm |")
  print("|---|---|---|---|---|")
  for row in rows:
    print(f"| {row['target']} | {row['cold_s']:.1f} | {row['first_kept_s']:.1f} |"
          f" {row['warm_s']:.2f} | {row['ratio']:.1f}x |")


if __name__ == "__main__":
  main()
