"""Clients that keep state vs their stateless twins, on W2, in one process.

    uv run python bench/stateful.py                # ~2 min on 2 cores
    uv run python bench/stateful.py --rounds 30 --runtimes inprocess,local
    uv run python bench/stateful.py --ray-check   # also: ray (2 workers) = inprocess?

Each row is a W2 round (`mlp` 784-200-200-10, 10 clients x 100 examples of
`emnist_synthetic`, batch 20, 1 epoch) played as the run loop plays it: the
clients' states are read from a `ClientStateStore`, the round runs, and the new
states are written back. Variants of a runtime take turns round by round (see
run.py's `interleaved_ms`), so load on a shared machine slows them alike; the
ratios printed are each stateful variant over its stateless twin:
  fedavg_top1 (top-1% upload)  vs  fedavg_top1_ef (the same with error feedback);
  fedavg                        vs  scaffold.
`fedprox` (mu 0.01) is stateless: it shows what one more pass over the model per
local step costs on this memory-bound workload, as SCAFFOLD's correction does.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workloads  # noqa: E402  (bench/workloads.py)
from run import THREADS_SET, interleaved_ms  # noqa: E402  (bench/run.py; sets TF's pools)
from fedsim.experiment.config.loader import load_config  # noqa: E402
from fedsim.experiment.round_clients import pack_client  # noqa: E402
from fedsim.experiment.simulation import build_simulation  # noqa: E402
from fedsim.state.client_states import ClientStateStore  # noqa: E402

TOP1 = [{"name": "encode", "encoder": "topk", "fraction": 0.01}]
VARIANTS = {
    "fedavg": ({}, []),
    "fedavg_top1": ({}, TOP1),
    "fedavg_top1_ef": ({}, [{**TOP1[0], "error_feedback": True}]),
    "scaffold": ({"name": "scaffold"}, []),
    "fedprox": ({"name": "fedprox", "mu": 0.01}, []),
}
PAIRS = (("fedavg_top1_ef", "fedavg_top1"), ("scaffold", "fedavg"), ("fedprox", "fedavg"))


def variant_config(variant: str, runtime: str) -> dict:
  algorithm, aggregation = VARIANTS[variant]
  config = workloads.config("W2")
  config["algorithm"] = {**config["algorithm"], **algorithm}
  if algorithm.get("name") == "scaffold":  # SCAFFOLD's step is its own (no client_optimizer)
    config["algorithm"] = {"name": "scaffold", "client_learning_rate": workloads.CLIENT_LR}
  config["aggregation"] = aggregation
  config["runtime"] = {"name": runtime}
  config["clients_per_round"] = 10
  return config


def round_fn(variant: str, runtime: str, tmp: pathlib.Path):
  """A no-arg function playing one round of all 10 clients, states on disk."""
  sim = build_simulation(load_config(variant_config(variant, runtime))[0])
  process = sim.round_process
  ids = list(sim.data.client_ids[:10])
  packed = [pack_client(sim, 1, cid) for cid in ids]
  state = [process.initialize()]
  store = (ClientStateStore(tmp / variant / runtime, sim.algorithm.initial_client_state)
           if sim.algorithm.stateful_clients else None)
  round_num = [0]

  def play():
    round_num[0] += 1
    if store is None:
      state[0], _ = process.next(state[0], packed)
      return
    state[0], _, new_states = process.next(state[0], packed, store.load(ids))
    store.save(ids, new_states, round_num[0])

  return play, sim.runtime_notice


def ray_check(rounds: int = 3) -> dict[str, float]:
  """Max |weight difference| after `rounds` full runs on `ray` (a private instance,
  2 workers) and on `inprocess`, per stateful variant."""
  import fedsim
  out = {}
  for variant in ("fedavg_top1_ef", "scaffold"):
    runs = {}
    for runtime in ({"name": "inprocess"}, {"name": "ray", "workers": 2}):
      config = {**variant_config(variant, "inprocess"), "rounds": rounds, "runtime": runtime}
      with tempfile.TemporaryDirectory() as tmp:
        runs[runtime["name"]] = fedsim.run(config, logdir=tmp, progress=False).final_weights
    out[variant] = max(float(abs(a - b).max()) for a, b in zip(runs["ray"], runs["inprocess"]))
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--runtimes", default="inprocess")
  parser.add_argument("--ray-check", action="store_true",
                      help="then run each stateful variant 3 rounds on ray and inprocess")
  args = parser.parse_args(argv)
  print(f"TensorFlow pools set as for runtime.threads: clients: {THREADS_SET}")
  with workloads.tff_session(), tempfile.TemporaryDirectory() as tmp:
    for runtime in args.runtimes.split(","):
      fns = {}
      for variant in VARIANTS:
        fns[variant], notice = round_fn(variant, runtime, pathlib.Path(tmp))
        if notice:
          print(f"  {variant} on {runtime}: {notice}")
      ms = interleaved_ms(fns, args.rounds, args.warmup)
      print(f"{runtime}: " + ", ".join(f"{v} {t:.1f}" for v, t in ms.items()) + " ms/round")
      for stateful, twin in PAIRS:
        print(f"  {stateful} / {twin}: {ms[stateful] / ms[twin]:.2f}x")
  if args.ray_check:
    for variant, diff in ray_check().items():
      print(f"ray (2 workers) vs inprocess, {variant}, 3 rounds: max |weight difference| {diff:.1e}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
