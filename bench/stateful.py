"""Clients that keep state vs their stateless twins, on W2 or P1, in one process.

    uv run python bench/stateful.py                # W2, ~2 min on 2 cores
    uv run python bench/stateful.py --workload P1  # ~5 min on 2 cores
    uv run python bench/stateful.py --rounds 30 --runtimes inprocess,local
    uv run python bench/stateful.py --variants fedavg,scaffold --overlaps 10,1
    uv run python bench/stateful.py --workload P1 --state-chunks 512,58
    uv run python bench/stateful.py --ops          # also: ops each round executes
    uv run python bench/stateful.py --ray-check    # also: ray (2 workers) = inprocess?

Each row is a round of a bench/workloads.py workload with every client of it,
played as the run loop plays it: the clients' states are read from a
`ClientStateStore`, the round runs, and the new states are written back.
  W2: `mlp` 784-200-200-10, 10 clients x 100 examples of `emnist_synthetic`,
      batch 20, 1 epoch (5 steps a client);
  P1: pfl-research's CIFAR-10 shape, `simple_cnn` (1,626,442 parameters), 50
      clients x 50 random 32x32x3 images, batch 10, 1 epoch (5 steps a client).
Variants of a runtime take turns round by round (run.py's `interleaved_times`),
so load on a shared machine slows them alike. Each round is timed by the wall
clock and by this process's CPU time (all threads), and the medians of both are
printed with the ratios of each stateful variant over its stateless twin:
  fedavg_top1 (top-1% upload)  vs  fedavg_top1_ef (the same with error feedback);
  fedavg                        vs  scaffold.
`fedprox` (mu 0.01) is stateless: it shows what one more pass over the model per
local step costs, as SCAFFOLD's correction does.

`--overlaps 10,1` builds every variant once per value of the client loop's
`parallel_iterations` (`round_graphs.OVERLAP`; a variant's name gets `@1`), all
taking turns. `--state-chunks 512,58` likewise builds every variant once per
bound on the client states one graph call holds (MiB; `inprocess`'s is 512;
58 splits P1's 50 stateful clients into six calls, as the 64 MiB bound on data
and states together did before states had a bound of their own; a variant's
name gets `@s58`). Each variant's graph calls per round are printed first.
`--ops` first counts, in one round of each variant after its
warm-up, the TensorFlow ops executed (`lockstep_ops.ops_executed`: one profiler
event per kernel run) and prints the op types each stateful variant runs more
than its twin.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import pathlib
import sys
import tempfile
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workloads  # noqa: E402  (bench/workloads.py)
from run import THREADS_SET, interleaved_times  # noqa: E402  (bench/run.py; sets TF's pools)
from fedsim.experiment.config.loader import load_config  # noqa: E402
from fedsim.experiment.round_clients import pack_client  # noqa: E402
from fedsim.experiment.simulation import build_simulation  # noqa: E402
from fedsim.runtime import inprocess, round_graphs  # noqa: E402
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
# Rounds and warm-up rounds by default: a P1 round takes ~2 s on 2 cores, W2's ~20 ms.
DEFAULT_ROUNDS = {"W2": (20, 2), "P1": (6, 1)}
CLIENTS = {"W2": 10, "P1": workloads.P1_CLIENTS}


def variant_config(variant: str, runtime: str, workload: str = "W2") -> dict:
  algorithm, aggregation = VARIANTS[variant]
  config = workloads.config(workload)
  config["algorithm"] = {**config["algorithm"], **algorithm}
  if algorithm.get("name") == "scaffold":  # SCAFFOLD's step is its own (no client_optimizer)
    config["algorithm"] = {"name": "scaffold", "client_learning_rate": workloads.CLIENT_LR}
  config["aggregation"] = aggregation
  config["runtime"] = {"name": runtime}
  config["clients_per_round"] = CLIENTS[workload]
  return config


def round_fn(variant: str, runtime: str, tmp: pathlib.Path, workload: str = "W2",
             overlap: int | None = None, state_chunk_mb: int | None = None):
  """A no-arg function playing one round of every client of `workload`, states
  in a store, the runtime's notice (or None) and the round's graph calls
  (`inprocess`; else None). `overlap`: the client loop's `parallel_iterations`
  (default `round_graphs.OVERLAP`); another value compiles `inprocess`'s round
  anew and holds it while the round is played (a round of several chunks traces
  its client loop at its first call). `state_chunk_mb`: MiB of client states
  one graph call holds (default `inprocess`'s)."""
  sim = build_simulation(load_config(variant_config(variant, runtime, workload))[0])
  process = sim.round_process
  if overlap is None or overlap == round_graphs.OVERLAP:
    held = contextlib.nullcontext
  else:
    def held():
      return mock.patch.object(round_graphs, "OVERLAP", overlap)

  if held is not contextlib.nullcontext or state_chunk_mb is not None:
    bounds = {} if state_chunk_mb is None else {"state_chunk_bytes": state_chunk_mb * 2**20}
    with held():  # not the simulation's round: that is cached per configuration
      process = inprocess.InProcessProcess(sim.algorithm.process, "auto", **bounds)
  ids = list(sim.data.client_ids[:CLIENTS[workload]])
  packed = [pack_client(sim, 1, cid) for cid in ids]
  state = [process.initialize()]
  store = (ClientStateStore(tmp / f"{variant}@{overlap}@s{state_chunk_mb}" / runtime,
                            sim.algorithm.initial_client_state)
           if sim.algorithm.stateful_clients else None)
  round_num = [0]

  def play():
    round_num[0] += 1
    with held():
      if store is None:
        state[0], _ = process.next(state[0], packed)
        return
      state[0], _, new_states = process.next(state[0], packed, store.load(ids))
    store.save(ids, new_states, round_num[0])

  calls = None
  if isinstance(process, inprocess.InProcessProcess):
    calls = sum(1 for _ in process._chunks(packed, store and store.load(ids)))
  return play, sim.runtime_notice, calls


def ray_check(rounds: int = 3, workload: str = "W2") -> dict[str, float]:
  """Max |weight difference| after `rounds` full runs on `ray` (a private instance,
  2 workers) and on `inprocess`, per stateful variant."""
  import fedsim
  out = {}
  for variant in ("fedavg_top1_ef", "scaffold"):
    runs = {}
    for runtime in ({"name": "inprocess"}, {"name": "ray", "workers": 2}):
      config = {**variant_config(variant, "inprocess", workload), "rounds": rounds,
                "runtime": runtime}
      with tempfile.TemporaryDirectory() as tmp:
        runs[runtime["name"]] = fedsim.run(config, logdir=tmp, progress=False).final_weights
    out[variant] = max(float(abs(a - b).max()) for a, b in zip(runs["ray"], runs["inprocess"]))
  return out


def print_ops(fns: dict, pairs) -> None:
  """Ops each variant's round executes, and the op types a stateful variant runs
  more (+) or fewer (-) times than its twin."""
  from lockstep_ops import ops_executed  # noqa: E402  (bench/lockstep_ops.py)
  types = {}
  for name, play in fns.items():
    play()  # its warm-up: tracing and first calls out of the count
    total, _, types[name] = ops_executed(play)
    print(f"  {name}: {total:,} ops a round", flush=True)
  for stateful, twin in pairs:
    diff = collections.Counter(types[stateful])
    diff.subtract(types[twin])
    # Op types only: the profiler also names function calls (" __inference_...").
    more = sorted(((k, v) for k, v in diff.items() if v and not k.startswith(" ")),
                  key=lambda kv: -abs(kv[1]))
    print(f"  {stateful} - {twin}: {sum(diff.values()):+,} ops: "
          + ", ".join(f"{k} {v:+,}" for k, v in more), flush=True)


def load() -> str:
  return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", default="W2", choices=sorted(DEFAULT_ROUNDS))
  parser.add_argument("--rounds", type=int, help="timed rounds per variant (W2 20, P1 6)")
  parser.add_argument("--warmup", type=int, help="untimed rounds first (W2 2, P1 1)")
  parser.add_argument("--runtimes", default="inprocess")
  parser.add_argument("--variants", default=",".join(VARIANTS),
                      help=f"comma-separated, of {', '.join(VARIANTS)}")
  parser.add_argument("--overlaps", default=str(round_graphs.OVERLAP),
                      help="the client loop's parallel_iterations, comma-separated")
  parser.add_argument("--state-chunks", default=str(inprocess._STATE_CHUNK_BYTES // 2**20),
                      help="MiB of client states one graph call holds, comma-separated")
  parser.add_argument("--ops", action="store_true", help="first count the ops of a round")
  parser.add_argument("--ray-check", action="store_true",
                      help="then run each stateful variant 3 rounds on ray and inprocess")
  args = parser.parse_args(argv)
  rounds, warmup = DEFAULT_ROUNDS[args.workload]
  rounds = rounds if args.rounds is None else args.rounds
  warmup = warmup if args.warmup is None else args.warmup
  variants = args.variants.split(",")
  if unknown := [v for v in variants if v not in VARIANTS]:
    parser.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
  overlaps = [int(n) for n in args.overlaps.split(",")]
  if overlaps != [round_graphs.OVERLAP] and args.runtimes != "inprocess":
    parser.error("--overlaps: only inprocess has a client loop to vary")
  state_chunks = [int(n) for n in args.state_chunks.split(",")]
  if len(state_chunks) > 1 and args.runtimes != "inprocess":
    parser.error("--state-chunks: only inprocess has graph calls to bound")
  print(f"{args.workload}, {rounds} rounds after {warmup}; TensorFlow pools set as for"
        f" runtime.threads: clients: {THREADS_SET}; {load()}", flush=True)
  with workloads.tff_session(), tempfile.TemporaryDirectory() as tmp:
    for runtime in args.runtimes.split(","):
      fns, pairs = {}, []
      # (overlap, state MiB, name tag): each value of one option with the other's first.
      builds = ([(overlaps[0], state_chunks[0], "")]
                + [(o, state_chunks[0], f"@{o}") for o in overlaps[1:]]
                + [(overlaps[0], mb, f"@s{mb}") for mb in state_chunks[1:]])
      default_mb = inprocess._STATE_CHUNK_BYTES // 2**20
      for overlap, state_mb, tag in builds:
        for variant in variants:
          fns[variant + tag], notice, calls = round_fn(
              variant, runtime, pathlib.Path(tmp), args.workload, overlap,
              None if state_mb == default_mb else state_mb)
          if notice:
            print(f"  {variant} on {runtime}: {notice}")
          if calls is not None:
            print(f"  {variant + tag}: {calls} graph call(s) a round", flush=True)
        pairs += [(a + tag, b + tag) for a, b in PAIRS if a in variants and b in variants]
        if tag:
          pairs += [(v + tag, v) for v in variants]
      if args.ops:
        print_ops(fns, pairs)
      times = interleaved_times(fns, rounds, warmup)
      for clock in ("wall", "cpu"):
        print(f"{runtime}, {clock} ms/round: "
              + ", ".join(f"{v} {t[clock]:.1f}" for v, t in times.items()))
      for a, b in pairs:
        print(f"  {a} / {b}: wall {times[a]['wall'] / times[b]['wall']:.2f}x,"
              f" CPU {times[a]['cpu'] / times[b]['cpu']:.2f}x")
      print(f"  {load()}", flush=True)
  if args.ray_check:
    for variant, diff in ray_check(workload=args.workload).items():
      print(f"ray (2 workers) vs inprocess, {variant}, 3 rounds: max |weight difference|"
            f" {diff:.1e}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
