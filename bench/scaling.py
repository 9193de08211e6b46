"""Round time against clients per round, and peak memory against population (W2).

    python bench/scaling.py [--clients 10,100,1000,10000] [--population 10000]
                            [--populations 1000,100000] [--no-memory]

Scaling rows: W2 (`mlp` 784-200-200-10, 100 examples per client, batch 20,
one epoch, FedAvg) on `inprocess`, each round as the run loop plays it:
`sampler.sample`, a lazy `RoundClients` (each client generated and packed
when the runtime reads it), `process.next`. ms/round is the median over the
rounds after one warm-up round; `pack ms` is the median time to generate and
pack the same clients alone (part of ms/round); CPU ms is this process's CPU
time (all its threads), which other load on a shared machine disturbs less
than wall time. Memory rows: one child
process per population (`population.py`). Run it under the shared lock:
`flock /tmp/heavy.lock uv run python bench/scaling.py`.
"""

from __future__ import annotations

import argparse
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


def rounds_for(clients: int) -> int:
  """Timed rounds per row: fewer where one round takes tens of seconds."""
  return 5 if clients <= 100 else 3 if clients <= 1000 else 2


def scaling_rows(counts, population: int, log: Callable[[str], None] = print) -> list[dict]:
  """One row per clients-per-round count: clients, rounds, ms, ms_per_client, pack_ms.

  Raises:
    ValueError: a count above `population`.
  """
  import workloads
  from fedsim.experiment.round_clients import RoundClients
  from fedsim.runtime import inprocess
  if max(counts) > population:
    raise ValueError(f"{max(counts)} clients per round from a population of {population}")
  sim = workloads.Workload("W2", num_clients=population).sim
  process = inprocess.InProcessProcess(sim.algorithm.process, "auto")
  state = [process.initialize()]
  round_num = [0]
  # Every client is generated afresh, as in a round over a large population.
  cold = getattr(sim.data.clients, "cache_clear", lambda: None)

  def play(count: int) -> tuple[float, float, float]:
    """Seconds of one loop round of `count` clients (wall, and CPU of this process), then
    wall seconds to generate and pack them alone."""
    round_num[0] += 1
    cold()
    begin, cpu = time.perf_counter(), time.process_time()
    clients = RoundClients(sim, round_num[0], sim.sampler.sample(round_num[0], count))
    state[0], _ = process.next(state[0], clients)
    seconds, cpu = time.perf_counter() - begin, time.process_time() - cpu
    cold()
    begin = time.perf_counter()
    for _ in clients:
      pass
    return seconds, cpu, time.perf_counter() - begin

  play(min(counts))  # warm-up: the first call traces the round
  rows = []
  for count in counts:
    n = rounds_for(count)
    timed = [play(count) for _ in range(n)]
    ms, cpu_ms, pack_ms = (statistics.median(t[k] for t in timed) * 1000 for k in range(3))
    rows.append({"clients": count, "rounds": n, "ms": ms, "ms_per_client": ms / count,
                 "cpu_ms_per_client": cpu_ms / count, "pack_ms": pack_ms,
                 "load": os.getloadavg()[0]})
    log(f"  W2 inprocess {count} clients/round: {ms:.0f} ms/round, {ms / count:.2f}"
        f" ms/client, CPU {cpu_ms / count:.2f} ms/client (generate + pack {pack_ms:.0f} ms;"
        f" load average {rows[-1]['load']:.1f})")
  return rows


def memory_rows(populations, log: Callable[[str], None] = print, *, clients_per_round=100,
                rounds=3) -> list[dict]:
  """One row per population, each measured in its own child process (`population.py`).

  Raises:
    RuntimeError: a child failed (its stderr's tail attached).
  """
  rows = []
  for population in populations:
    child = subprocess.run(
        [sys.executable, str(HERE / "population.py"), str(population), str(rounds),
         str(clients_per_round)], capture_output=True, text=True, timeout=1800, check=False)
    if child.returncode != 0:
      raise RuntimeError(f"population.py {population} failed:\n{child.stderr[-2000:]}")
    row = json.loads(child.stdout.strip().splitlines()[-1])
    rows.append(row)
    log(f"  population {population}: peak RSS {row['peak_rss_mib']:.0f} MiB, resident"
        f" {row['rss_mib']:.0f} MiB at the end, examples held {row['data_mib']:.0f} MiB"
        f" (eager: {row['eager_mib']:.0f} MiB)")
  return rows


def markdown(scaling: list[dict], memory: list[dict]) -> str:
  """The tables of `scaling_rows` and `memory_rows` as Markdown."""
  out = []
  if scaling:
    out += ["| clients/round | ms/round | ms/client | CPU ms/client |"
            " of which generate + pack (ms) | rounds | load average |",
            "|---|---|---|---|---|---|---|"]
    out += [f"| {r['clients']:,} | {r['ms']:,.0f} | {r['ms_per_client']:.2f} |"
            f" {r['cpu_ms_per_client']:.2f} | {r['pack_ms']:,.0f} | {r['rounds']} |"
            f" {r['load']:.1f} |" for r in scaling]
    out.append("")
  if memory:
    out += ["| population | clients/round | peak RSS (MiB) | resident at end (MiB) |"
            " examples held (MiB) | all clients' examples (MiB) |", "|---|---|---|---|---|---|"]
    out += [f"| {r['population']:,} | {r['clients_per_round']} | {r['peak_rss_mib']:,.0f} |"
            f" {r['rss_mib']:,.0f} | {r['data_mib']:,.0f} | {r['eager_mib']:,.0f} |"
            for r in memory]
    out.append("")
  return "\n".join(out)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", default="10,100,1000,10000")
  parser.add_argument("--population", type=int, default=10000)
  parser.add_argument("--populations", default="1000,100000")
  parser.add_argument("--no-memory", action="store_true")
  parser.add_argument("--no-scaling", action="store_true")
  args = parser.parse_args()
  memory = [] if args.no_memory else memory_rows(
      [int(p) for p in args.populations.split(",")])
  scaling = [] if args.no_scaling else scaling_rows(
      [int(c) for c in args.clients.split(",")], args.population)
  print(markdown(scaling, memory))


if __name__ == "__main__":
  main()
