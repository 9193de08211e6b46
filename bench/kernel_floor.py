"""How close a CNN round on `inprocess` is to what this CPU's kernels allow.

    uv run python bench/kernel_floor.py              # P1, 3 profiled rounds
    uv run python bench/kernel_floor.py --workload W1 --rounds 2

Plays `--rounds` rounds of the workload (bench/workloads.py; after a warm-up)
under TensorFlow's profiler and sums the kernels' own time by op type
(`lockstep_ops.kernel_events`: thread-milliseconds, since each kernel runs on
one thread with `runtime.threads: clients`). The convolutions' and matrix
products' FLOPs come from the model's layers and the round's examples (forward
2 x MACs; the filter gradient as many; the input gradient as many for every
layer but the first), so each family's GFLOP/s per thread is its arithmetic
over its kernels' time. Then the single-thread peak of this machine's
TensorFlow on a 2048 x 2048 matrix product and on the model's largest
convolution (forward, one batch), measured in the same process.

Printed: the table, the share of the round's wall time x threads the kernels
were busy, and a floor: the round if every convolution ran at the measured
convolution peak and everything else took what it took, spread over the
threads. A round near its floor is bound by its arithmetic, not by fedsim.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import tensorflow as tf  # noqa: E402

import workloads  # noqa: E402  (bench/workloads.py)
from lockstep_ops import kernel_events  # noqa: E402
from run import THREADS_SET  # noqa: E402  (bench/run.py; sets TF's pools)

FAMILIES = (("conv forward", "Conv2D"), ("conv filter gradient", "Conv2DBackpropFilter"),
            ("conv input gradient", "Conv2DBackpropInput"), ("matrix products", "MatMul"))
WRAPPERS = ("Run", "__inference_")  # a graph call's own event spans its kernels'


def family(op_type: str) -> str | None:
  for name, marker in reversed(FAMILIES):  # the gradients' names contain "Conv2D" too
    if marker in op_type:
      return name
  return None


def conv_forward_flop(layer: tf.keras.layers.Conv2D) -> float:
  """One example's forward FLOPs of a convolution: 2 x output positions x filters x kernel."""
  kh, kw, cin, cout = (int(d) for d in layer.kernel.shape)
  _, oh, ow, _ = layer.output.shape
  return 2.0 * int(oh) * int(ow) * cout * kh * kw * cin


def layer_gflop(model: tf.keras.Model, examples: int) -> dict[str, float]:
  """Each family's GFLOP for `examples` examples' training steps."""
  flop = collections.Counter()
  weighted = [l for l in model.layers if isinstance(l, (tf.keras.layers.Conv2D,
                                                         tf.keras.layers.Dense))]
  for index, layer in enumerate(weighted):
    if isinstance(layer, tf.keras.layers.Conv2D):
      forward = conv_forward_flop(layer)
      flop["conv forward"] += forward
      flop["conv filter gradient"] += forward
      flop["conv input gradient"] += forward if index else 0.0
    else:
      forward = 2.0 * int(layer.kernel.shape[0]) * int(layer.kernel.shape[1])
      flop["matrix products"] += forward * (3 if index else 2)
  return {name: value * examples / 1e9 for name, value in flop.items()}


def peak_gflops(fn, args, flop: float) -> float:
  fn(*args).numpy()
  best = float("inf")
  for _ in range(5):
    start = time.perf_counter()
    for _ in range(10):
      out = fn(*args)
    out.numpy()
    best = min(best, (time.perf_counter() - start) / 10)
  return flop / best / 1e9


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", default="P1", choices=["P1", "W1"])
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  print(f"load average before {os.getloadavg()[0]:.2f}; TensorFlow: " + (
      "intra-op 1 thread, inter-op one per core" if THREADS_SET else "its default pools"))
  work = workloads.Workload(args.workload)
  run = work.round_fn("inprocess")
  run()
  run()
  walls = []

  def rounds():
    for _ in range(args.rounds):
      start = time.perf_counter()
      run()
      walls.append(time.perf_counter() - start)

  thread_ms, calls = collections.Counter(), collections.Counter()
  for _, op_type, ms in kernel_events(rounds):
    if not op_type.strip().startswith(WRAPPERS):
      thread_ms[op_type] += ms / args.rounds
      calls[op_type] += 1
  wall_ms = 1e3 * sum(walls) / args.rounds
  threads = tf.config.threading.get_inter_op_parallelism_threads() or os.cpu_count()
  model = work._keras_model()  # pylint: disable=protected-access
  examples = sum(int(work.sim.data.clients[c].y.shape[0]) for c in work.clients())
  gflop = layer_gflop(model, examples)

  # Single-thread peaks (each op on one thread, as in the round).
  a = tf.random.normal([2048, 2048])
  matmul_peak = peak_gflops(tf.function(tf.matmul), (a, a), 2.0 * 2048**3)
  convs = [l for l in model.layers if isinstance(l, tf.keras.layers.Conv2D)]
  largest = max(convs, key=conv_forward_flop)
  batch = workloads.P1_BATCH if args.workload == "P1" else workloads.BATCH_SIZE
  x = tf.random.normal([batch, *largest.input.shape[1:]])
  kernel = tf.random.normal(largest.kernel.shape)
  padding = largest.padding.upper()
  conv_peak = peak_gflops(tf.function(lambda x, k: tf.nn.conv2d(x, k, 1, padding)),
                          (x, kernel), batch * conv_forward_flop(largest))

  print(f"\n{work.description}: {args.rounds} profiled rounds, {wall_ms:,.0f} ms a round"
        f" (wall), {examples} examples")
  print("| kernels | calls a round | thread-ms a round | GFLOP a round | GFLOP/s per thread |")
  print("|---|---|---|---|---|")
  by_family = collections.Counter()
  for op_type, ms in thread_ms.items():
    by_family[family(op_type) or "other"] += ms
  for name, _ in FAMILIES:
    n = sum(c for t, c in calls.items() if family(t) == name) // args.rounds
    rate = gflop[name] / (by_family[name] / 1e3) if by_family[name] else float("nan")
    print(f"| {name} | {n:,} | {by_family[name]:,.0f} | {gflop[name]:.1f} | {rate:.0f} |")
  others = [(t, ms) for t, ms in thread_ms.most_common() if family(t) is None]
  print(f"| everything else | {sum(calls[t] for t, _ in others) // args.rounds:,} |"
        f" {by_family['other']:,.0f} | | |")
  print("\nlargest other kernels (thread-ms a round): " + ", ".join(
      f"{t} {ms:.0f}" for t, ms in others[:8]))
  busy = sum(thread_ms.values())
  print(f"kernels busy {busy:,.0f} thread-ms of {wall_ms:,.0f} ms x {threads} threads"
        f" = {100 * busy / (wall_ms * threads):.0f}%")
  print(f"single-thread peaks: matmul 2048^3 {matmul_peak:.0f} GFLOP/s; conv"
        f" {largest.name} forward, batch {batch}: {conv_peak:.0f} GFLOP/s")
  conv_gflop = sum(gflop[n] for n, _ in FAMILIES[:3])
  floor = (1e3 * conv_gflop / conv_peak + busy - sum(by_family[n] for n, _ in FAMILIES[:3]))
  print(f"floor (every convolution at the conv peak, the rest as measured, over {threads}"
        f" threads): {floor / threads:,.0f} ms a round; the round is"
        f" {wall_ms / (floor / threads):.2f}x of it")
  print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
