"""Round time of fedsim's runtimes vs stock TFF and a plain-TensorFlow lower bound.

    uv run python bench/run.py            # everything, ~6-8 min on 2 cores
    uv run python bench/run.py --quick    # fewer rounds, no 1,000-client row, no memory test
    uv run python bench/run.py --workloads W2 --runtimes inprocess,lower_bound --no-scaling

Prints the tables and writes them to bench/results.md (--out to change).
Workloads (FedAvg, client SGD lr 0.1, server SGD lr 1, batch 20, 1 epoch,
28x28x1 `emnist_synthetic` data, all clients every round):
  W2: `mlp` 784-200-200-10, 10 clients x 100 examples;
  W1: `cnn` (McMahan et al. 2017), 10 clients x 200 examples.
ms/round is the median over --rounds rounds after --warmup rounds, of the
call that runs a round (client data already packed, as the run loop times it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workloads  # noqa: E402  (bench/workloads.py)

RUNTIMES = ("stock_tff", "local", "inprocess", "lower_bound")


def median_ms(run_round, rounds: int, warmup: int) -> float:
  return interleaved_ms({"_": run_round}, rounds, warmup)["_"]


def interleaved_ms(round_fns: dict, rounds: int, warmup: int) -> dict[str, float]:
  """Median ms/round of each function, timed in turns (A B C A B C ...).

  Other processes on a shared machine then slow every runtime alike, so
  the ratios hold even when the absolute numbers drift.
  """
  for run_round in round_fns.values():
    for _ in range(warmup):
      run_round()
  times = {name: [] for name in round_fns}
  for _ in range(rounds):
    for name, run_round in round_fns.items():
      start = time.perf_counter()
      run_round()
      times[name].append(time.perf_counter() - start)
  return {name: 1000 * statistics.median(t) for name, t in times.items()}


def round_table(names, runtimes, rounds, warmup, log) -> list[dict]:
  rows = []
  for name in names:
    bench = workloads.Workload(name)
    row = {"workload": name, "description": bench.description}
    row.update(interleaved_ms({r: bench.round_fn(r) for r in runtimes}, rounds, warmup))
    log(f"  {name}: " + ", ".join(f"{r} {row[r]:.1f}" for r in runtimes) + " ms/round")
    rows.append(row)
  return rows


def scaling_table(counts, rounds, log) -> list[dict]:
  bench = workloads.Workload("W2", num_clients=max(counts))
  rows = []
  for count in counts:
    n = rounds if count < 1000 else max(3, rounds // 2)
    ms = median_ms(bench.round_fn("inprocess", count), n, 1)
    rows.append({"clients": count, "ms": ms, "rounds": n})
    log(f"  W2 inprocess {count} clients/round: {ms:.0f} ms/round")
  return rows


def peak_rss(populations, log) -> list[dict]:
  rows = []
  for population in populations:
    child = subprocess.run(
        [sys.executable, str(HERE / "population.py"), str(population)],
        capture_output=True, text=True, timeout=600, check=False)
    if child.returncode != 0:
      raise RuntimeError(f"population.py {population} failed:\n{child.stderr[-2000:]}")
    row = json.loads(child.stdout.strip().splitlines()[-1])
    rows.append(row)
    log(f"  population {population}: peak RSS {row['peak_rss_mib']:.0f} MiB"
        f" (client data {row['data_mib']:.0f} MiB)")
  return rows


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


def markdown(rows, scaling, memory, runtimes, host, args) -> str:
  out = ["# fedsim round-time benchmark", "",
         f"`uv run python bench/run.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
         f"on {datetime.date.today()}: {host}.", "",
         f"ms/round: median of {args.rounds} rounds after {args.warmup} warm-up rounds; the"
         " runtimes of a workload take turns round by round, so load from other"
         " processes hits them alike.", ""]
  if rows:
    header = ["workload"] + list(runtimes)
    ratios = [r for r in ("local", "inprocess") if r in runtimes]
    if "lower_bound" in runtimes:
      header += [f"{r} / lower_bound" for r in ratios]
    if "stock_tff" in runtimes:
      header += [f"stock_tff / {r}" for r in ratios]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
      cells = [f"{row['workload']}: {row['description']}"]
      cells += [f"{row[r]:.1f}" for r in runtimes]
      if "lower_bound" in runtimes:
        cells += [f"{row[r] / row['lower_bound']:.2f}x" for r in ratios]
      if "stock_tff" in runtimes:
        cells += [f"{row['stock_tff'] / row[r]:.1f}x faster" for r in ratios]
      out.append("| " + " | ".join(cells) + " |")
    out.append("")
  if scaling:
    base = scaling[0]
    out += ["## Scaling (W2 clients, `inprocess`)", "",
            "| clients/round | ms/round | ms/client | rounds timed |", "|---|---|---|---|"]
    out += [f"| {r['clients']} | {r['ms']:.0f} | {r['ms'] / r['clients']:.2f} | {r['rounds']} |"
            for r in scaling]
    out += ["", f"ms per client relative to {base['clients']} clients/round: " + ", ".join(
        f"{r['clients']}: {r['ms'] / r['clients'] / (base['ms'] / base['clients']):.2f}x"
        for r in scaling), ""]
  if memory:
    out += ["## Peak memory vs population (W2 clients, 10 clients/round, `inprocess`)", "",
            "| population | peak RSS (MiB) | client data held (MiB) |", "|---|---|---|"]
    out += [f"| {r['population']} | {r['peak_rss_mib']:.0f} | {r['data_mib']:.0f} |"
            for r in memory]
    out.append("")
  out += goals(rows, runtimes)
  return "\n".join(out)


def goals(rows, runtimes) -> list[str]:
  """Issue 5's goals for `inprocess`, checked against this run's table."""
  if not rows or not {"inprocess", "lower_bound", "stock_tff"} <= set(runtimes):
    return []
  out = ["## Goals (inprocess <= 1.25x lower bound, >= 5x faster than stock TFF)", ""]
  for row in rows:
    bound = row["inprocess"] / row["lower_bound"]
    speedup = row["stock_tff"] / row["inprocess"]
    ceiling = row["stock_tff"] / row["lower_bound"]
    line = (f"- {row['workload']}: {bound:.2f}x the lower bound"
            f" ({'met' if bound <= 1.25 else 'MISSED'}), {speedup:.1f}x faster than stock TFF"
            f" ({'met' if speedup >= 5 else 'MISSED'})")
    if speedup < 5:
      line += (f"; even the lower bound is only {ceiling:.1f}x faster than stock TFF here:"
               " the round is arithmetic, not runtime overhead")
    out.append(line + ".")
  return out + [""]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workloads", default="W2,W1")
  parser.add_argument("--runtimes", default=",".join(RUNTIMES))
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--scaling", default="10,100,1000",
                      help="clients per round for the scaling rows")
  parser.add_argument("--no-scaling", action="store_true")
  parser.add_argument("--populations", default="100,3400")
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
  log(f"machine: {host}")
  started = time.perf_counter()
  with workloads.tff_session():
    rows = round_table([w for w in args.workloads.split(",") if w], runtimes,
                       args.rounds, args.warmup, log)
  scaling = [] if args.no_scaling else scaling_table(
      [int(c) for c in args.scaling.split(",")], args.rounds, log)
  memory = [] if args.no_memory else peak_rss(
      [int(p) for p in args.populations.split(",")], log)
  text = markdown(rows, scaling, memory, runtimes, host, args)
  text += f"\nWhole benchmark: {time.perf_counter() - started:.0f} s.\n"
  pathlib.Path(args.out).write_text(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
