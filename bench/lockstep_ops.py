"""TensorFlow ops executed per round, `lockstep` against `inprocess`, and CPU time on W2.

    uv run python bench/lockstep_ops.py                          # 10, 100, 1,000 clients
    uv run python bench/lockstep_ops.py --clients 10,100 --timed-rounds 30 --device cpu

Workload W2 (bench/workloads.py: `mlp` 784-200-200-10, 100 examples a client,
batch 20, 1 epoch, FedAvg with client SGD 0.1 and server SGD 1.0), every
client of the population in the round. For each clients-per-round count it
builds both runtimes on the same algorithm and packed clients, plays one
warm-up round each, then one round each under TensorFlow's profiler
(`tf.profiler.experimental`) and counts the op executions the profiler saw:
the host trace's events named `node:OpType`, one per kernel TensorFlow ran
(every iteration of a loop counts again). On a GPU the trace also has the
device's own planes: their kernel events are counted as well. `inprocess`
runs each client's steps as ops of their own, so its count grows with the
clients; `lockstep` runs one batched op per step for all clients, so its
count follows the longest client's steps (and the number of graph calls,
`--memory-mb`).

Then, at the first count, rounds of the two runtimes are interleaved
(`--timed-rounds` each, after the warm-up) and the process CPU time
(`time.process_time`, all threads) and wall time of each round measured; the
medians and their ratio lockstep / inprocess are printed with the load average.
Runs on any machine TensorFlow runs on, unchanged: `--device auto` places both
runtimes on a GPU when TensorFlow sees one.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorflow as tf  # noqa: E402

import workloads  # noqa: E402  (bench/workloads.py)
from fedsim.experiment.round_clients import RoundClients  # noqa: E402
from fedsim.runtime import inprocess, lockstep  # noqa: E402

try:  # where TF 2.14 ships the profiler's trace format
  from tsl.profiler.protobuf import xplane_pb2
except ImportError:  # pragma: no cover (other TF layouts)
  from tensorflow.tsl.profiler.protobuf import xplane_pb2


def kernel_events(run_round) -> list[tuple[bool, str, float]]:
  """`(on a device, op type, milliseconds)` of every kernel run in one call of
  `run_round`, from TensorFlow's profiler trace: host events are named
  `node:OpType` (the executor's own events are left out); a device's events
  are its kernels (their type is the event's name)."""
  with tempfile.TemporaryDirectory(prefix="lockstep_ops_") as logdir:
    tf.profiler.experimental.start(logdir, tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=3, device_tracer_level=1))
    try:
      run_round()
    finally:
      tf.profiler.experimental.stop()
    spaces = []
    for path in glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True):
      spaces.append(xplane_pb2.XSpace())
      with open(path, "rb") as f:
        spaces[-1].ParseFromString(f.read())
  events = []
  for space in spaces:
    for plane in space.planes:
      names = plane.event_metadata
      on_device = plane.name.startswith("/device:")
      for line in plane.lines:
        for event in line.events:
          name = names[event.metadata_id].name
          if on_device:
            events.append((True, name, event.duration_ps / 1e9))
          elif ":" in name and not name.startswith(("ExecutorState", "EagerKernel")):
            events.append((False, name.rsplit(":", 1)[1], event.duration_ps / 1e9))
  return events


def ops_executed(run_round) -> tuple[int, int, collections.Counter]:
  """`(host op executions, device kernel events, op types)` of one call of `run_round`."""
  host, device, types = 0, 0, collections.Counter()
  for on_device, op_type, _ in kernel_events(run_round):
    if on_device:
      device += 1
    else:
      host += 1
      types[op_type] += 1
  return host, device, types


class Rounds:
  """One runtime's round on fixed clients, state carried from round to round."""

  def __init__(self, process, packed):
    self.process, self.packed = process, packed
    self.state = process.initialize()

  def __call__(self):
    self.state, _ = self.process.next(self.state, self.packed)


def build(count: int, device: str, memory_mb: int):
  work = workloads.Workload("W2", num_clients=count)
  ids = work.clients(count)
  packed = list(RoundClients(work.sim, 1, ids))
  runs = {
      "inprocess": Rounds(inprocess.InProcessProcess(work.sim.algorithm.process, device), packed),
      "lockstep": Rounds(lockstep.LockstepRound(work.sim.algorithm, device, memory_mb * 2**20),
                         packed),
  }
  calls = len(list(lockstep.padded_chunks(packed, memory_mb * 2**20,
                                          runs["lockstep"].process._weight_bytes())))
  steps = max(int(p["mask"].shape[0]) for p in packed)
  return work, runs, calls, steps


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", default="10,100,1000", help="clients per round, comma-separated")
  parser.add_argument("--timed-rounds", type=int, default=20, help="0: count ops only")
  parser.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"])
  parser.add_argument("--memory-mb", type=int, default=8192,
                      help="lockstep's memory_mb: MiB of stacked clients per graph call")
  args = parser.parse_args(argv)
  counts = [int(c) for c in args.clients.split(",")]
  print(f"load average at start: {os.getloadavg()}; GPUs TensorFlow sees:"
        f" {len(tf.config.list_physical_devices('GPU'))}")
  print("| clients per round | local steps | inprocess ops | lockstep ops | lockstep graph"
        " calls | lockstep device kernels | training GFLOP |")
  print("|---|---|---|---|---|---|---|")
  timed = None
  for count in counts:
    work, runs, calls, steps = build(count, args.device, args.memory_mb)
    found = {}
    for name, run in runs.items():
      run()  # warm-up: traces and first-call costs out of the count
      found[name] = ops_executed(run)
    print(f"| {count:,} | {steps} | {found['inprocess'][0]:,} | {found['lockstep'][0]:,} |"
          f" {calls} | {found['lockstep'][1]:,} |"
          f" {work.train_flops_per_round(count) / 1e9:.2f} |", flush=True)
    if timed is None:
      timed = runs
      top = {n: f[2].most_common(6) for n, f in found.items()}
    else:
      del runs
  print(f"most executed op types at {counts[0]} clients: {top}")
  if args.timed_rounds < 1:
    return 0
  cpu, wall = collections.defaultdict(list), collections.defaultdict(list)
  for _ in range(args.timed_rounds):
    for name, run in timed.items():  # interleaved: both see the same load
      c0, w0 = time.process_time(), time.perf_counter()
      run()
      cpu[name].append(time.process_time() - c0)
      wall[name].append(time.perf_counter() - w0)
  med = {n: (statistics.median(cpu[n]) * 1e3, statistics.median(wall[n]) * 1e3) for n in cpu}
  print(f"W2 at {counts[0]} clients, {args.timed_rounds} interleaved rounds each, median ms"
        f" per round (CPU / wall): inprocess {med['inprocess'][0]:.1f} /"
        f" {med['inprocess'][1]:.1f}, lockstep {med['lockstep'][0]:.1f} /"
        f" {med['lockstep'][1]:.1f}; lockstep / inprocess CPU"
        f" {med['lockstep'][0] / med['inprocess'][0]:.2f}x, wall"
        f" {med['lockstep'][1] / med['inprocess'][1]:.2f}x")
  print(f"load average at end: {os.getloadavg()}")
  return 0


if __name__ == "__main__":
  with workloads.tff_session():
    sys.exit(main())
