"""CNN rounds on `inprocess` against the hand-written graph loop: kernels run, then time.

    uv run python bench/cnn_rounds.py                       # counts W2, W1; times W1, P1
    uv run python bench/cnn_rounds.py --counts-only
    uv run python bench/cnn_rounds.py --threads tensorflow  # TF's own pools instead
    uv run python bench/cnn_rounds.py --compare-threads 2   # both layouts, 2 processes each

Counts: one round of each runtime after a warm-up, under TensorFlow's profiler
(`lockstep_ops.ops_executed`: one event per kernel run), with max-pools paired
with oneDNN's kernel (`fedsim.backend.onednn`, what fedsim does) and without it
(`unpaired`: TensorFlow's layout pass decides, a draw per process), and the
max-pool gradient kernels each ran. Counts do not depend on the load.

Times: ms per round, median of `--rounds` after `--warmup`, `inprocess`, the graph
loop, `inprocess` with unpaired pools (and the kernels its draw gave) and
`inprocess` training one client at a time (its client loop's parallel_iterations
1 instead of `round_graphs.OVERLAP`) taking turns round by round (`run.interleaved_ms`), W1 (bench/run.py's
CNN) and P1 (pfl-research's CIFAR-10 shape without dropout: 50 clients x 50
images 32x32x3, batch 10; bench/workloads.py). TensorFlow's pools are fixed when
it starts, so `--compare-threads N` runs this script's timing N times per layout
in child processes, alternating `clients` and `tensorflow`, and prints each
child's lines. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _load() -> str:
  return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def counts(names) -> None:
  import workloads  # noqa: E402
  from lockstep_ops import ops_executed  # noqa: E402
  print("| workload | runtime | max-pools | ops per round | max-pool gradient kernels |")
  print("|---|---|---|---|---|")
  for name in names:
    work = workloads.Workload(name)
    for runtime in ("inprocess", "graph_loop"):
      for paired in (True, False):
        run_round = work.round_fn(runtime, pair_pools=paired)
        run_round()
        host, _, types = ops_executed(run_round)
        grads = {k: v for k, v in types.items() if k.endswith("MaxPoolGrad")}
        print(f"| {name} | {runtime} | {'paired' if paired else 'unpaired'} | {host:,} |"
              f" {grads or '-'} |", flush=True)
    if name == "W1":
      top = collections.Counter()
      for runtime in ("inprocess", "graph_loop"):
        _, _, types = ops_executed(work.round_fn(runtime))
        for op, n in types.items():
          top[op] += n if runtime == "inprocess" else -n
      print(f"W1 op types inprocess runs more (+) or fewer (-) than the graph loop:"
            f" {dict(sorted(((k, v) for k, v in top.items() if v), key=lambda kv: -abs(kv[1])))}")


def times(names, rounds: int, warmup: int, threads: str) -> None:
  import run  # noqa: E402  (bench/run.py: interleaved_ms)
  import workloads  # noqa: E402
  from unittest import mock

  from fedsim.runtime import round_graphs
  from lockstep_ops import ops_executed  # noqa: E402
  for name in names:
    work = workloads.Workload(name)
    fns = {r: work.round_fn(r) for r in ("inprocess", "graph_loop")}
    fns["unpaired"] = work.round_fn("inprocess", pair_pools=False)
    with mock.patch.object(round_graphs, "OVERLAP", 1):
      fns["one_at_a_time"] = work.round_fn("inprocess", fresh=True)
    ms = run.interleaved_ms(fns, rounds, warmup)
    drawn = {k: v for k, v in ops_executed(fns["unpaired"])[2].items()
             if k.endswith("MaxPoolGrad")}
    print(f"{name} threads={threads}: inprocess {ms['inprocess']:.0f} ms, graph_loop"
          f" {ms['graph_loop']:.0f} ms, inprocess / graph_loop"
          f" {ms['inprocess'] / ms['graph_loop']:.2f}x; inprocess unpaired"
          f" {ms['unpaired']:.0f} ms ({ms['unpaired'] / ms['inprocess']:.2f}x of paired;"
          f" its pool gradients ran {drawn}); inprocess one client at a time"
          f" {ms['one_at_a_time']:.0f} ms ({ms['one_at_a_time'] / ms['inprocess']:.2f}x)"
          f" ({_load()})", flush=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--count-workloads", default="W2,W1")
  parser.add_argument("--time-workloads", default="W1,P1")
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--threads", default="clients", choices=["clients", "tensorflow"])
  parser.add_argument("--counts-only", action="store_true")
  parser.add_argument("--times-only", action="store_true")
  parser.add_argument("--compare-threads", type=int, default=0, metavar="N",
                      help="N child processes per thread layout, alternating; times only")
  args = parser.parse_args(argv)
  print(_load(), flush=True)
  if args.compare_threads:
    for _ in range(args.compare_threads):
      for threads in ("clients", "tensorflow"):
        subprocess.run([sys.executable, __file__, "--times-only", "--threads", threads,
                        "--time-workloads", args.time_workloads, "--rounds", str(args.rounds),
                        "--warmup", str(args.warmup)], check=True)
    print(_load())
    return 0

  from fedsim.runtime.devices import configure_threads
  set_now = configure_threads(args.threads)
  import tensorflow as tf
  tf.constant(0.0)  # TensorFlow's pools are now fixed: run.py's own setting leaves them
  print(f"threads: {args.threads} (intra-op {tf.config.threading.get_intra_op_parallelism_threads()},"
        f" inter-op {tf.config.threading.get_inter_op_parallelism_threads()};"
        f" set here: {set_now})", flush=True)
  import workloads  # noqa: E402
  with workloads.tff_session():
    if not args.times_only:
      counts([w for w in args.count_workloads.split(",") if w])
    if not args.counts_only:
      times([w for w in args.time_workloads.split(",") if w], args.rounds, args.warmup,
            args.threads)
  print(_load())
  return 0


if __name__ == "__main__":
  sys.exit(main())
