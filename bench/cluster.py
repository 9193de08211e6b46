"""Round time of the `ray` runtime against clients per round and workers (W2).

    flock /tmp/heavy.lock uv run python bench/cluster.py [--clients 100,1000]
        [--workers 1,2] [--population 10000] [--big 10000] [--memory 1000,100000]

W2 (`mlp` 784-200-200-10, `emnist_synthetic` clients of 100 examples generated
on demand, batch 20, one epoch, FedAvg) on a private Ray instance
(`address: local`) of 1 or 2 workers with one CPU each. Each round is played
as the loop plays it: a lazy `RoundClients` whose ids go to the actors, which
generate and pack their own clients. After each ray round the same clients
run on `inprocess` in this process (TensorFlow's threads on every core), so
load from others on a shared machine slows both alike. ms/round is the median
after one warm-up round. Driver costs: `merge` of two accumulators and
`start` + `finish` (prepare, report, update), medians of 50 calls.

`--big N` adds one round of N clients on the largest worker count. `--memory`
runs one child process per population (`--rss`): the driver's peak RSS
(VmHWM) while playing 2 rounds of 1,000 clients on 2 workers.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workloads  # noqa: E402
from fedsim.experiment.config.loader import plain  # noqa: E402
from fedsim.experiment.round_clients import RoundClients  # noqa: E402
from fedsim.experiment.simulation import cluster_worker  # noqa: E402
from fedsim.runtime import cluster, inprocess  # noqa: E402


def rounds_for(clients: int) -> int:
  return 5 if clients <= 100 else 3 if clients <= 1000 else 1


def _median_ms(fn: Callable[[], object], calls: int = 50) -> float:
  times = []
  for _ in range(calls):
    begin = time.perf_counter()
    fn()
    times.append(time.perf_counter() - begin)
  return statistics.median(times) * 1000


class Bench:
  """W2 over `population` clients: the driver's process and round counter."""

  def __init__(self, population: int):
    self.sim = workloads.Workload("W2", num_clients=population).sim
    self.driver = inprocess.InProcessProcess(self.sim.algorithm.process, "cpu")
    self.build = functools.partial(cluster_worker, plain(self.sim.config), "cpu")
    self.state = self.driver.initialize()
    self.round_num = 0

  def clients(self, count: int) -> RoundClients:
    self.round_num += 1
    return RoundClients(self.sim, self.round_num, self.sim.sampler.sample(self.round_num, count))

  def timed(self, process, clients) -> float:
    getattr(self.sim.data.clients, "cache_clear", lambda: None)()  # generated afresh
    begin = time.perf_counter()
    self.state, _ = process.next(self.state, clients)
    return time.perf_counter() - begin

  def driver_costs(self) -> dict[str, float]:
    client_input, zero = self.driver.start(self.state)
    del client_input
    return {"merge_ms": _median_ms(lambda: self.driver.merge(zero, zero)),
            "start_finish_ms": _median_ms(lambda: self.driver.finish(
                self.state, self.driver.start(self.state)[1]))}

  def cluster(self, workers: int) -> cluster.ClusterProcess:
    return cluster.ClusterProcess(self.driver, self.build, cluster.ClusterSpec(
        address="local", workers=workers, device="cpu"))


def scaling_rows(bench: Bench, counts, workers_list, big: int | None,
                 log: Callable[[str], None] = print) -> list[dict]:
  rows = []
  for workers in workers_list:
    begin = time.perf_counter()
    process = bench.cluster(workers)
    log(f"  ray W{workers}: started and built in {time.perf_counter() - begin:.1f} s")
    try:
      bench.timed(process, bench.clients(min(counts)))  # warm-up (traces the round)
      bench.timed(bench.driver, bench.clients(min(counts)))
      plan = [(c, rounds_for(c)) for c in counts]
      if big and workers == max(workers_list):
        plan.append((big, 1))
      for count, n in plan:
        timed = []
        for _ in range(n):
          clients = bench.clients(count)
          timed.append((bench.timed(process, clients), bench.timed(bench.driver, clients)))
        ray_ms = statistics.median(t for t, _ in timed) * 1000
        local_ms = statistics.median(t for _, t in timed) * 1000
        rows.append({"workers": workers, "clients": count, "rounds": n, "ray_ms": ray_ms,
                     "ray_ms_per_client": ray_ms / count, "inprocess_ms": local_ms})
        log(f"  ray W{workers} {count} clients/round: {ray_ms:.0f} ms ({ray_ms / count:.2f}"
            f" ms/client); inprocess {local_ms:.0f} ms")
    finally:
      process.close()
  return rows


def rss_row(population: int, per_round: int, rounds: int) -> dict:
  """In this (child) process: the driver's peak RSS over `rounds` ray rounds (2 workers)."""
  bench = Bench(population)
  process = bench.cluster(2)
  try:
    for _ in range(rounds):
      bench.state, _ = process.next(bench.state, bench.clients(per_round))
  finally:
    process.close()
  return {"population": population, "clients_per_round": per_round,
          "peak_rss_mib": _peak_rss_mib()}


def _peak_rss_mib() -> float:
  """This process's peak resident set (VmHWM), MiB. Not ru_maxrss: a child
  inherits its parent's at fork, so it would report the parent's peak."""
  with open("/proc/self/status") as f:
    kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
  return kib / 1024


def memory_rows(populations, per_round: int = 1000, rounds: int = 2,
                log: Callable[[str], None] = print) -> list[dict]:
  rows = []
  for population in populations:
    child = subprocess.run([sys.executable, __file__, "--rss", str(population),
                            "--clients", str(per_round), "--rounds", str(rounds)],
                           capture_output=True, text=True, timeout=1800, check=False)
    if child.returncode != 0:
      raise RuntimeError(f"--rss {population} failed:\n{child.stderr[-2000:]}")
    rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
    log(f"  population {population:,}: driver peak RSS {rows[-1]['peak_rss_mib']:.0f} MiB")
  return rows


def markdown(rows: list[dict], costs: dict[str, float], memory: list[dict]) -> str:
  out = ["| workers | clients/round | ray ms/round | ray ms/client | inprocess ms/round |"
         " rounds |", "|---|---|---|---|---|---|"]
  out += [f"| {r['workers']} | {r['clients']:,} | {r['ray_ms']:,.0f} |"
          f" {r['ray_ms_per_client']:.2f} | {r['inprocess_ms']:,.0f} | {r['rounds']} |"
          for r in rows]
  out += ["", f"Driver: merge {costs['merge_ms']:.2f} ms, start + finish"
          f" {costs['start_finish_ms']:.2f} ms per round.", ""]
  if memory:
    out += ["| population | clients/round | driver peak RSS (MiB) |", "|---|---|---|"]
    out += [f"| {r['population']:,} | {r['clients_per_round']:,} | {r['peak_rss_mib']:,.0f} |"
            for r in memory]
  return "\n".join(out)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", default="100,1000")
  parser.add_argument("--workers", default="1,2")
  parser.add_argument("--population", type=int, default=10000)
  parser.add_argument("--big", type=int, default=0, help="one round of this many clients")
  parser.add_argument("--memory", default="", help="populations, e.g. 1000,100000")
  parser.add_argument("--rss", type=int, help=argparse.SUPPRESS)
  parser.add_argument("--rounds", type=int, default=2, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.rss:
    print(json.dumps(rss_row(args.rss, int(args.clients), args.rounds)))
    return
  bench = Bench(args.population)
  costs = bench.driver_costs()
  rows = scaling_rows(bench, [int(c) for c in args.clients.split(",")],
                      [int(w) for w in args.workers.split(",")], args.big or None)
  memory = memory_rows([int(p) for p in args.memory.split(",")]) if args.memory else []
  print(markdown(rows, costs, memory))


if __name__ == "__main__":
  main()
