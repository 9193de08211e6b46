"""FedBuff's server update on `local` and `inprocess`, with FedAvg's round beside it, on W2.

    uv run python bench/buffered.py              # ~2 min on 2 cores
    uv run python bench/buffered.py --rounds 30

A FedBuff row is one server update of K = 10 clients as the buffered loop plays
it when all ten arrive together (concurrency = K, staleness 0): the dispatch
round (the clients download the model and train; each client's result comes
back) and the server update over the ten arrivals. A FedAvg row is the
synchronous round of the same ten clients. W2: `mlp` 784-200-200-10, 10
clients x 100 `emnist_synthetic` examples, batch 20, 1 epoch. All four take
turns round by round (run.py's `interleaved_ms`), so machine load slows them alike.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workloads  # noqa: E402  (bench/workloads.py)
from run import THREADS_SET, interleaved_ms  # noqa: E402  (bench/run.py; sets TF's pools)
from fedsim.experiment.config.loader import load_config  # noqa: E402
from fedsim.experiment.round_clients import RoundClients  # noqa: E402
from fedsim.experiment.simulation import build_simulation  # noqa: E402
from fedsim.learning.buffered import arrival  # noqa: E402


def round_fn(algorithm: str, runtime: str):
  """A no-arg function playing one round (FedAvg) or server update (FedBuff) of W2's
  ten clients on `runtime`, and the runtime's fallback notice (None)."""
  config = workloads.config("W2")
  config["clients_per_round"] = 10
  config["runtime"] = {"name": runtime}
  if algorithm == "fedbuff":
    config["algorithm"] = {**config["algorithm"], "name": "fedbuff"}
  sim = build_simulation(load_config(config)[0])
  ids = list(sim.data.client_ids[:10])
  state = [sim.round_process.initialize()]
  round_num = [0]

  def play():
    round_num[0] += 1
    clients = RoundClients(sim, round_num[0], ids)
    if sim.dispatch_process is None:
      state[0], _ = sim.round_process.next(state[0], clients)
      return
    state[0], _, outputs = sim.dispatch_process.next(state[0], clients)
    state[0], _ = sim.round_process.next(state[0], [arrival(o, 0) for o in outputs])

  return play, sim.runtime_notice


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--warmup", type=int, default=2)
  args = parser.parse_args(argv)
  print(f"TensorFlow pools set as for runtime.threads: clients: {THREADS_SET}")
  with workloads.tff_session():
    fns = {}
    for runtime in ("local", "inprocess"):
      for algorithm in ("fedbuff", "fedavg"):
        fns[f"{algorithm} on {runtime}"], notice = round_fn(algorithm, runtime)
        if notice:
          print(f"  {algorithm} on {runtime}: {notice}")
    ms = interleaved_ms(fns, args.rounds, args.warmup)
  for name, t in ms.items():
    print(f"{name}: {t:.1f} ms/round")
  for algorithm in ("fedbuff", "fedavg"):
    print(f"{algorithm}: local / inprocess"
          f" {ms[f'{algorithm} on local'] / ms[f'{algorithm} on inprocess']:.2f}x")
  return 0


if __name__ == "__main__":
  sys.exit(main())
