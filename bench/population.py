"""Child process of bench/run.py: peak RSS of a W2 run over a population.

    python bench/population.py POPULATION [ROUNDS]

Builds `emnist_synthetic` with POPULATION clients x 100 examples, runs ROUNDS
(default 3) rounds of 10 sampled clients on `inprocess`, and prints one JSON
line: population, peak_rss_mib (ru_maxrss) and data_mib (the client examples
the dataset holds in memory).
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import workloads  # noqa: E402
from fedsim.experiment.simulation import client_batches  # noqa: E402
from fedsim.runtime import inprocess  # noqa: E402


def main() -> None:
  population = int(sys.argv[1])
  rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
  bench = workloads.Workload("W2", num_clients=population)
  sim = bench.sim
  process = inprocess.InProcessProcess(sim.algorithm.process, "cpu")
  state = process.initialize()
  for round_num in range(1, rounds + 1):
    ids = sim.sampler.sample(round_num, 10)
    state, _ = process.next(state, list(client_batches(sim, round_num, ids).values()))
  data = sum(c.x.nbytes + c.y.nbytes for c in sim.data.clients.values())
  print(json.dumps({
      "population": population,
      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      "data_mib": data / 2**20}))


if __name__ == "__main__":
  main()
