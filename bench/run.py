"""Round time of fedsim vs a hand-written TensorFlow graph and stock TFF.

    uv run python bench/run.py            # everything, ~3-4 min on 2 cores (--rounds 40: ~4)
    uv run python bench/run.py --quick    # fewer rounds, no 1,000-client row, no memory test
    uv run python bench/run.py --workloads W2 --runtimes inprocess,graph_loop --no-scaling

Prints the tables and writes them to bench/results.md (--out to change).
Workloads (FedAvg, client SGD lr 0.1, server SGD lr 1, batch 20, 1 epoch,
28x28x1 `emnist_synthetic` data, all clients every round):
  W2: `mlp` 784-200-200-10, 10 clients x 100 examples;
  W1: `cnn` (McMahan et al. 2017), 10 clients x 200 examples.
Runtimes: `inprocess` (fedsim, `runtime.name: inprocess`), `graph_loop` (the
hand-written reference of baselines.py: every client in one tf.function),
`stock_tff` (TFF's own FedAvg on its C++ worker), `local` (fedsim on TFF's
worker), `python_loop` (one tf.function call per client); `_bf16` variants
run `runtime.precision: bfloat16` and the reference in bfloat16.
ms/round is the median over --rounds rounds after --warmup rounds, of the
call that runs a round on clients packed beforehand (the run loop's round_seconds
also count packing, ~0.3 ms a client: see the scaling rows).
This process runs TensorFlow with `runtime.threads: clients` (fedsim's
default for inprocess): each op on one thread, as many at once as cores.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import pathlib
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workloads  # noqa: E402  (bench/workloads.py)
from fedsim.runtime.devices import configure_threads  # noqa: E402

# As `fedsim run` does for inprocess, before TensorFlow runs its first op.
THREADS_SET = configure_threads("clients")

RUNTIMES = ("stock_tff", "local", "inprocess", "graph_loop", "python_loop",
            "inprocess_bf16", "graph_loop_bf16")
DEFAULT_RUNTIMES = ("stock_tff", "inprocess", "graph_loop", "inprocess_bf16", "graph_loop_bf16")
# Assumed 512-bit FMA units per core (Sapphire Rapids and Zen 5 server parts
# have two); not readable from /proc/cpuinfo.
FMA_UNITS_PER_CORE = 2
# Untimed pause before each timed round (see `interleaved_ms`).
SETTLE_S = 0.05


def interleaved_ms(round_fns: dict, rounds: int, warmup: int) -> dict[str, float]:
  """Median ms/round of each function, timed in turns (A B C A B C ...).

  Other processes on a shared machine then slow every runtime alike, so
  the ratios hold even when the absolute numbers drift. Between turns, and
  untimed, Python's garbage collector runs and the machine gets a moment to
  settle: otherwise a stock TFF round (~10^5 Python objects, and its worker
  process still busy after it returns) slowed whichever runtime came next,
  W2's 8 ms rounds by ~2 ms. Each runtime still pays for the collections its
  own round triggers.
  """
  return {name: t["wall"] for name, t in interleaved_times(round_fns, rounds, warmup).items()}


def interleaved_times(round_fns: dict, rounds: int, warmup: int) -> dict[str, dict[str, float]]:
  """`interleaved_ms`'s rounds, each timed twice: per function the median wall
  ms/round (`wall`) and the median CPU ms/round of this process, all its
  threads (`cpu`: `time.process_time`, less sensitive than wall time to other
  processes on the cores, though it counts TensorFlow's threads spinning for work)."""
  for run_round in round_fns.values():
    for _ in range(warmup):
      run_round()
  wall = {name: [] for name in round_fns}
  cpu = {name: [] for name in round_fns}
  for _ in range(rounds):
    for name, run_round in round_fns.items():
      gc.collect()
      time.sleep(SETTLE_S)
      start, start_cpu = time.perf_counter(), time.process_time()
      run_round()
      cpu[name].append(time.process_time() - start_cpu)
      wall[name].append(time.perf_counter() - start)
  return {name: {"wall": 1000 * statistics.median(wall[name]),
                 "cpu": 1000 * statistics.median(cpu[name])} for name in round_fns}


def round_table(names, runtimes, rounds, warmup, log) -> list[dict]:
  rows = []
  for name in names:
    benches = {"float32": workloads.Workload(name)}
    if any(r.endswith("_bf16") for r in runtimes):
      benches["bfloat16"] = workloads.Workload(name, precision="bfloat16")
    fns = {}
    for r in runtimes:
      bench = benches["bfloat16" if r.endswith("_bf16") else "float32"]
      fns[r] = bench.round_fn(r.removesuffix("_bf16"))
    row = {"workload": name, "description": benches["float32"].description,
           "gflop": benches["float32"].train_flops_per_round() / 1e9}
    row.update(interleaved_ms(fns, rounds, warmup))
    log(f"  {name}: " + ", ".join(f"{r} {row[r]:.1f}" for r in runtimes) + " ms/round")
    rows.append(row)
  return rows


def fp32_peak() -> tuple[float, str]:
  """FP32 peak GFLOP/s of this machine and how it was derived.

  cores x GHz x FLOPs/cycle per core, where FLOPs/cycle = FMA units x FP32
  lanes per vector (16 with AVX-512, 8 with AVX2) x 2 (an FMA is a multiply
  and an add). Cores and GHz ('cpu MHz') come from /proc/cpuinfo, the lanes
  from its flags; the FMA units per core are an assumption (see
  FMA_UNITS_PER_CORE).
  """
  cores, mhz, flags = os.cpu_count() or 1, 0.0, set()
  try:
    with open("/proc/cpuinfo") as f:
      text = f.read()
    cores = text.count("\nprocessor") + text.startswith("processor")
    mhz = float(next(l.split(":")[1] for l in text.splitlines() if l.startswith("cpu MHz")))
    flags = set(next(l.split(":")[1] for l in text.splitlines() if l.startswith("flags")).split())
  except (OSError, StopIteration, ValueError):
    pass
  lanes, isa = (16, "avx512f") if "avx512f" in flags else (8, "avx2") if "avx2" in flags else (4, "sse")
  per_cycle = FMA_UNITS_PER_CORE * lanes * 2
  peak = cores * mhz / 1000 * per_cycle
  how = (f"{cores} cores x {mhz / 1000:.2f} GHz ('cpu MHz' in /proc/cpuinfo) x {per_cycle}"
         f" FLOP/cycle ({FMA_UNITS_PER_CORE} FMA units per core, assumed, x {lanes} FP32 lanes"
         f" ({isa} in the flags) x 2 for multiply-add) = {peak:.0f} GFLOP/s")
  return peak, how


def scaling_table(counts, log) -> list[dict]:
  """Round time at each clients-per-round count, as the loop plays rounds (clients
  generated and packed lazily: 10,000 a round are never held at once); see
  bench/scaling.py."""
  import scaling  # noqa: E402  (bench/scaling.py)
  return scaling.scaling_rows(counts, max(max(counts), 1000), log)


def peak_rss(populations, log) -> list[dict]:
  """Peak RSS of a W2 run over each population, each in its own child process."""
  import scaling  # noqa: E402
  return scaling.memory_rows(populations, log)


def machine() -> str:
  import tensorflow as tf
  import tensorflow_federated as tff
  cpu = platform.processor() or "unknown"
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  gpus = len(tf.config.list_physical_devices("GPU"))
  return (f"{cpu}, {os.cpu_count()} cores, {gpus} GPU; {platform.system()} "
          f"{platform.release()}; Python {platform.python_version()}, TensorFlow"
          f" {tf.__version__}, TFF {tff.__version__}; load average before the run"
          f" {os.getloadavg()[0]:.2f}")


def markdown(rows, scaling, memory, runtimes, host, args, peak) -> str:
  peak_gflops, peak_how = peak
  out = ["# fedsim round-time benchmark", "",
         f"`uv run python bench/run.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
         f"on {datetime.date.today()}: {host}.", "",
         f"ms/round: median of {args.rounds} rounds after {args.warmup} warm-up rounds; the"
         " runtimes of a workload take turns round by round, so load from other"
         " processes hits them alike. TensorFlow in this process: " + (
             "intra-op 1 thread, inter-op one per core (`runtime.threads: clients`)."
             if THREADS_SET else "its default pools (it started before they could be set)."),
         ""]
  if rows:
    ref = "graph_loop" if "graph_loop" in runtimes else None
    header = ["workload"] + [f"{r} ms" for r in runtimes]
    if ref and "inprocess" in runtimes:
      header.append("inprocess / graph_loop")
    if "inprocess_bf16" in runtimes and "graph_loop_bf16" in runtimes:
      header.append("inprocess_bf16 / graph_loop_bf16")
    if "stock_tff" in runtimes and "inprocess" in runtimes:
      header.append("stock_tff / inprocess")
    measured = [r for r in runtimes if r != "stock_tff"]
    header += [f"{r} GFLOP/s (% of FP32 peak)" for r in measured if r.startswith(
        ("inprocess", "graph_loop"))]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
      cells = [f"{row['workload']}: {row['description']}, {row['gflop']:.1f} GFLOP"]
      cells += [f"{row[r]:.1f}" for r in runtimes]
      if ref and "inprocess" in runtimes:
        cells.append(f"{row['inprocess'] / row[ref]:.2f}x")
      if "inprocess_bf16" in runtimes and "graph_loop_bf16" in runtimes:
        cells.append(f"{row['inprocess_bf16'] / row['graph_loop_bf16']:.2f}x")
      if "stock_tff" in runtimes and "inprocess" in runtimes:
        cells.append(f"{row['stock_tff'] / row['inprocess']:.1f}x faster")
      for r in measured:
        if r.startswith(("inprocess", "graph_loop")):
          rate = row["gflop"] / (row[r] / 1000)
          cells.append(f"{rate:.0f} ({100 * rate / peak_gflops:.0f}%)")
      out.append("| " + " | ".join(cells) + " |")
    out += ["", "GFLOP per round: examples x 3 x 2 x MACs per example (forward = 2 FLOPs per"
            " multiply-accumulate of the Dense and Conv2D layers; forward + backward ~ 3x"
            " forward); the same count for bfloat16 rows.",
            f"FP32 peak: {peak_how}."]
    over = [(row[r] and row["gflop"] / (row[r] / 1000) / peak_gflops, row["workload"], r)
            for row in rows for r in measured
            if r.startswith(("inprocess", "graph_loop")) and not r.endswith("_bf16")]
    top = max(over, default=None)
    if top and top[0] > 1:
      out.append(f"{top[2]} on {top[1]} ran at {100 * top[0]:.0f}% of that peak: the cores"
                 " run above the nominal 'cpu MHz' clock (boost), which the machine does not"
                 " report, so the true peak is higher and % of peak overstates how much of it"
                 " a run uses.")
    out.append("")
  if scaling or memory:
    import scaling as scaling_bench  # noqa: E402
    if scaling:
      base = scaling[0]
      out += ["## Scaling (W2 clients, `inprocess`, lazily generated and packed)", "",
              scaling_bench.markdown(scaling, []),
              f"ms per client relative to {base['clients']} clients/round: " + ", ".join(
                  f"{r['clients']:,}: {r['ms_per_client'] / base['ms_per_client']:.2f}x"
                  for r in scaling), ""]
    if memory:
      out += ["## Peak memory vs population (W2 clients, `inprocess`)", "",
              scaling_bench.markdown([], memory)]
  out += goals(rows, runtimes, peak_gflops)
  return "\n".join(out)


def goals(rows, runtimes, peak_gflops) -> list[str]:
  """Issue 16's goals for `inprocess`, checked against this run's table."""
  if not rows or not {"inprocess", "graph_loop"} <= set(runtimes):
    return []
  out = ["## Goals (inprocess <= 1.2x the graph loop on W2 and W1; W2 >= 12x faster than"
         " stock TFF; W1 >= 50% of FP32 peak)", ""]
  for row in rows:
    bound = row["inprocess"] / row["graph_loop"]
    line = f"- {row['workload']}: {bound:.2f}x the graph loop ({'met' if bound <= 1.2 else 'MISSED'})"
    if row["workload"] == "W2" and "stock_tff" in runtimes:
      speedup = row["stock_tff"] / row["inprocess"]
      line += f", {speedup:.1f}x faster than stock TFF ({'met' if speedup >= 12 else 'MISSED'})"
    if row["workload"] == "W1":
      share = row["gflop"] / (row["inprocess"] / 1000) / peak_gflops
      line += f", {100 * share:.0f}% of FP32 peak ({'met' if share >= 0.5 else 'MISSED'})"
    out.append(line + ".")
  return out + [""]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workloads", default="W2,W1")
  parser.add_argument("--runtimes", default=",".join(DEFAULT_RUNTIMES),
                      help=f"comma-separated, of {', '.join(RUNTIMES)}")
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--scaling", default="10,100,1000,10000",
                      help="clients per round for the scaling rows")
  parser.add_argument("--no-scaling", action="store_true")
  parser.add_argument("--populations", default="1000,100000")
  parser.add_argument("--no-memory", action="store_true")
  parser.add_argument("--quick", action="store_true",
                      help="3 rounds, 1 warm-up, scaling 10/100, no memory test")
  parser.add_argument("--out", default=str(HERE / "results.md"))
  args = parser.parse_args(argv)
  if args.quick:
    args.rounds, args.warmup, args.scaling, args.no_memory = 3, 1, "10,100", True
  runtimes = [r for r in args.runtimes.split(",") if r]
  unknown = set(runtimes) - set(RUNTIMES)
  if unknown:
    parser.error(f"--runtimes: unknown {sorted(unknown)}; choose from {', '.join(RUNTIMES)}")

  def log(message):
    print(message, file=sys.stderr, flush=True)

  host = machine()
  peak = fp32_peak()
  log(f"machine: {host}")
  log(f"FP32 peak: {peak[1]}")
  if not THREADS_SET:
    log("warning: TensorFlow started before the thread pools could be set")
  started = time.perf_counter()
  with workloads.tff_session():
    rows = round_table([w for w in args.workloads.split(",") if w], runtimes,
                       args.rounds, args.warmup, log)
  scaling = [] if args.no_scaling else scaling_table(
      [int(c) for c in args.scaling.split(",")], log)
  memory = [] if args.no_memory else peak_rss(
      [int(p) for p in args.populations.split(",")], log)
  text = markdown(rows, scaling, memory, runtimes, host, args, peak)
  text += f"\nWhole benchmark: {time.perf_counter() - started:.0f} s.\n"
  pathlib.Path(args.out).write_text(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
