"""Child process of bench/run.py: peak RSS of a W2 run over a population.

    python bench/population.py POPULATION [ROUNDS] [CLIENTS_PER_ROUND]

Builds `emnist_synthetic` with POPULATION clients x 100 examples (generated
on demand), runs ROUNDS (default 3) rounds of CLIENTS_PER_ROUND (default 100)
sampled clients on `inprocess` the way the run loop does (a lazy
`RoundClients`), and prints one JSON line: population, clients_per_round,
peak_rss_mib (VmHWM of this process), rss_mib (resident at the end),
data_mib (client examples the dataset holds in memory at the end: its LRU
cache) and eager_mib (what holding every client's examples would take).
Each population runs in its own process, so one's peak cannot hide another's.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import workloads  # noqa: E402
from fedsim.experiment.round_clients import RoundClients  # noqa: E402
from fedsim.runtime import inprocess  # noqa: E402

MIB = 2**20


def status_mib(field: str) -> float:
  """A memory line of /proc/self/status (VmRSS: resident now, VmHWM: its peak), MiB.

  VmHWM rather than ru_maxrss: a child's ru_maxrss can carry its parent's peak.
  """
  with open("/proc/self/status") as f:
    kib = next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
  return kib / 1024


def held_mib(clients) -> float:
  """MiB of examples a client mapping holds: its cache if lazy, else every client."""
  held = getattr(clients, "_cache", clients)
  return sum(c.x.nbytes + c.y.nbytes for c in held.values()) / MIB


def main() -> None:
  population = int(sys.argv[1])
  rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
  per_round = int(sys.argv[3]) if len(sys.argv) > 3 else 100
  sim = workloads.Workload("W2", num_clients=population).sim
  process = inprocess.InProcessProcess(sim.algorithm.process, "cpu")
  state = process.initialize()
  for round_num in range(1, rounds + 1):
    ids = sim.sampler.sample(round_num, per_round)
    state, _ = process.next(state, RoundClients(sim, round_num, ids))
  example_bytes = sim.data.test.x[0].nbytes + sim.data.test.y[0].nbytes
  eager = sum(sim.data.client_size(c) for c in sim.data.client_ids) * example_bytes
  print(json.dumps({
      "population": population, "clients_per_round": per_round,
      "peak_rss_mib": status_mib("VmHWM"), "rss_mib": status_mib("VmRSS"),
      "data_mib": held_mib(sim.data.clients),
      "eager_mib": eager / MIB}))


if __name__ == "__main__":
  main()
