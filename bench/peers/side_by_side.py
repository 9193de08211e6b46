"""fedsim beside Flower and pfl-research on the same workloads, one command.

    uv run python bench/peers/side_by_side.py            # W2 and P1, 3 interleaved passes
    uv run python bench/peers/side_by_side.py --quick    # check the machinery: W2 6 rounds, P1 2
    uv run python bench/peers/side_by_side.py --workloads W2 --repeats 5 --rounds 40

The first run creates the peers' environment (env.py: Flower and pfl-research pinned,
CPU PyTorch; outside the repository, never a dependency of fedsim). Every framework
runs as its own process, set up as its docs teach (fedsim_run.py, pfl_run.py,
flower_run.py), and prints each round's end; whole runs are interleaved (fedsim,
pfl 1 process, pfl 2 processes, Flower 1 CPU per client, Flower 2 CPUs; then again),
so that load from elsewhere falls on all of them. Reported per configuration: the
median ms from one round's end to the next after --warmup rounds, its ratio to fedsim's,
the seconds from the process's launch to the end of round 1, and whether the loss
fell; with the load average before and after each workload and the CPU model.
Writes bench/results_peers.md (--out; --quick only prints unless --out is given).
Exits 1 if a run failed or its loss did not fall.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import math
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import env  # noqa: E402  (bench/peers/)
import protocol  # noqa: E402
import shared_workloads as sw  # noqa: E402

FRAMEWORKS = ("fedsim", "pfl-1", "pfl-2", "flower-1cpu", "flower-2cpu")
LABELS = {"fedsim": "fedsim (`inprocess`)", "pfl-1": "pfl, 1 process",
          "pfl-2": "pfl, 2 processes (torchrun)", "flower-1cpu": "Flower, 1 CPU per client",
          "flower-2cpu": "Flower, 2 CPUs per client"}
ROUNDS = {"W2": 40, "P1": 8}
# Seconds a round may take before a run is given up (a loaded 2-core machine, Flower
# at 2 CPUs per client on P1 the slowest), plus start-up.
ROUND_LIMIT_S = {"W2": 15, "P1": 120}
STARTUP_LIMIT_S = 300
# Every process a run starts inherits this variable, Ray's daemons and actors and
# torchrun's workers included: how leftovers are found and ended.
TAG = "FEDSIM_PEERS_RUN"


def command(framework: str, workload: str, rounds: int, peers_python: pathlib.Path):
  rounds_args = [workload, "--rounds", str(rounds)]
  if framework == "fedsim":
    return [sys.executable, str(HERE / "fedsim_run.py"), *rounds_args]
  if framework == "pfl-1":
    return [str(peers_python), str(HERE / "pfl_run.py"), *rounds_args]
  if framework == "pfl-2":
    return [str(peers_python.parent / "torchrun"), "--nproc_per_node=2",
            str(HERE / "pfl_run.py"), *rounds_args]
  cpus = {"flower-1cpu": "1", "flower-2cpu": "2"}[framework]
  return [str(peers_python), str(HERE / "flower_run.py"), *rounds_args, "--cpus", cpus]


def child_env(framework: str, tag: str) -> dict:
  out = dict(os.environ, PYTHONPATH=str(HERE), TF_CPP_MIN_LOG_LEVEL="2", **{TAG: tag})
  out.pop("VIRTUAL_ENV", None)
  if framework.startswith("flower"):
    # Ray starts its actors at niceness 15 by default: on a machine where anything
    # else runs, Flower's clients would yield to it while fedsim and pfl do not.
    out["RAY_worker_niceness"] = "0"
  return out


def tagged_processes(tag: str) -> list[int]:
  """Ids of live processes whose environment carries `TAG=tag`."""
  needle = f"{TAG}={tag}".encode()
  found = []
  for entry in pathlib.Path("/proc").iterdir():
    if entry.name.isdigit() and int(entry.name) != os.getpid():
      try:
        if needle in (entry / "environ").read_bytes().split(b"\0"):
          found.append(int(entry.name))
      except OSError:  # gone meanwhile, or not ours to read
        pass
  return found


def end_processes(tag: str) -> int:
  """Ends every process of run `tag` (TERM, then KILL); returns how many were alive."""
  alive = tagged_processes(tag)
  for sig in (signal.SIGTERM, signal.SIGKILL):
    for pid in alive:
      try:
        os.kill(pid, sig)
      except ProcessLookupError:
        pass
    deadline = time.time() + 5
    while alive and time.time() < deadline:
      time.sleep(0.2)
      alive = tagged_processes(tag)
    if not alive:
      break
  return len(alive)


def run_once(framework: str, workload: str, rounds: int, peers_python, tag: str) -> dict:
  """One whole run: its round records, launch time, exit status and log tail."""
  cmd = command(framework, workload, rounds, peers_python)
  tail: collections.deque = collections.deque(maxlen=40)
  records, extra = [], {}
  launched = time.time()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=child_env(framework, tag), cwd=str(HERE), start_new_session=True)

  def read():
    for line in proc.stdout:
      parsed = protocol.parse(line)
      if parsed is None:
        tail.append(line.rstrip())
      elif "round" in parsed:
        records.append(parsed)
      else:
        extra.update(parsed)

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  limit = STARTUP_LIMIT_S + rounds * ROUND_LIMIT_S[workload]
  try:
    code = proc.wait(timeout=limit)
  except subprocess.TimeoutExpired:
    code = None
  finally:
    left = len(tagged_processes(tag))
    end_processes(tag)
    proc.wait()
  reader.join(timeout=10)
  return {"framework": framework, "launched": launched, "records": records, "extra": extra,
          "exit": code, "left_behind": left if code is not None else 0,
          "tail": list(tail), "load": os.getloadavg()[0]}


def summarize(run: dict, rounds: int, warmup: int) -> dict:
  """Round-to-round ms after warm-up, start-up s, loss check; `error` if unusable."""
  recs = sorted(run["records"], key=lambda r: r["round"])
  out = {"framework": run["framework"], "load": run["load"]}
  if run["exit"] != 0 or [r["round"] for r in recs] != list(range(1, rounds + 1)):
    why = "timed out" if run["exit"] is None else f"exit {run['exit']}"
    out["error"] = f"{why}, {len(recs)} of {rounds} rounds"
    return out
  failures = sum(r.get("failures", 0) for r in recs)
  if failures:  # Flower goes on without a failed client: a cheaper round, not the workload
    out["error"] = f"{failures} client update(s) failed"
    return out
  ts = [r["t"] for r in recs]
  out["ms"] = [1000 * (b - a) for a, b in zip(ts[warmup - 1:], ts[warmup:])]
  out["startup_s"] = ts[0] - run["launched"]
  if "loss_before" in run["extra"]:
    first, last = run["extra"]["loss_before"], run["extra"]["loss_after"]
  else:
    first, last = recs[0]["loss"], recs[-1]["loss"]
  out["loss"] = (first, last)
  out["loss_falls"] = (first is not None and last is not None
                       and math.isfinite(first) and math.isfinite(last) and last < first)
  if recs[0].get("round_seconds") is not None:
    out["own_ms"] = [1000 * r["round_seconds"] for r in recs[warmup:]]
  return out


def cpu_model() -> str:
  with open("/proc/cpuinfo") as f:
    lines = f.read().splitlines()
  names = [l.split(":", 1)[1].strip() for l in lines if l.startswith("model name")]
  return f"{names[0] if names else 'unknown CPU'}, {len(names) or os.cpu_count()} logical CPUs"


def fedsim_revision() -> str:
  try:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def fmt_ms(ms: float) -> str:
  return f"{ms:,.1f}" if ms < 100 else f"{ms:,.0f}"


def markdown(results: dict, args, versions: dict) -> str:
  lines = [
      f"# fedsim beside Flower and pfl-research ({datetime.date.today().isoformat()})", "",
      "`" + " ".join(["uv run python bench/peers/side_by_side.py", *sys.argv[1:]]) + "`",
      "", f"- CPU: {cpu_model()}",
      f"- fedsim {fedsim_revision()}; " + ", ".join(f"{k} {v}" for k, v in versions.items()),
      f"- {args.repeats} interleaved pass(es); ms/round: median over the runs' rounds from one"
      f" round's end to the next after {args.warmup} warm-up round(s); start-up: launch to"
      " the end of round 1 (median over runs)", ""]
  for workload, (pass_runs, rounds, loads) in results.items():
    w = sw.WORKLOADS[workload]
    lines += [f"## {workload}: {w.description}", "",
              f"{rounds} rounds a run; load average (1 min) before / after the workload:"
              f" {loads[0]:.2f} / {loads[1]:.2f}", "",
              "| configuration | ms/round (median) | vs fedsim | start-up to round 1 (s) |"
              " loss first -> last | runs |",
              "|---|---|---|---|---|---|"]
    by_fw = collections.defaultdict(list)
    for s in pass_runs:
      by_fw[s["framework"]].append(s)
    medians = {fw: statistics.median([m for s in runs if "ms" in s for m in s["ms"]])
               for fw, runs in by_fw.items() if any("ms" in s for s in runs)}
    for fw in [f for f in FRAMEWORKS if f in by_fw]:
      runs = by_fw[fw]
      good = [s for s in runs if "ms" in s]
      errors = sorted({s["error"] for s in runs if "error" in s})
      if not good:
        lines.append(f"| {LABELS[fw]} | failed: {'; '.join(errors)} | | | | 0/{len(runs)} |")
        continue
      ratio = (f"{medians[fw] / medians['fedsim']:.2f}x" if "fedsim" in medians else "")
      startup = statistics.median(s["startup_s"] for s in good)
      loss = "; ".join(f"{a:.3f} -> {b:.3f}{'' if s['loss_falls'] else ' (did not fall)'}"
                       for s in good for a, b in [s["loss"]])
      note = f" ({'; '.join(errors)})" if errors else ""
      lines.append(f"| {LABELS[fw]} | {fmt_ms(medians[fw])} | {ratio} | {startup:.1f} |"
                   f" {loss} | {len(good)}/{len(runs)}{note} |")
    own = [m for s in by_fw.get("fedsim", []) for m in s.get("own_ms", [])]
    if own:
      lines += ["", f"fedsim's own `round_seconds` (the compiled round alone), median of the"
                f" same rounds: {fmt_ms(statistics.median(own))} ms."]
    lines += ["", "Per run (in the order they ran): "
              + ", ".join(f"{s['framework']} {fmt_ms(statistics.median(s['ms']))}"
                          if "ms" in s else f"{s['framework']} failed" for s in pass_runs)
              + ".", ""]
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workloads", default="W2,P1", help="comma-separated: W2, P1")
  parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                      help=f"comma-separated, of {', '.join(FRAMEWORKS)}")
  parser.add_argument("--rounds", type=int, help="rounds a run (default W2 40, P1 8)")
  parser.add_argument("--warmup", type=int, default=2, help="rounds not timed (>= 1)")
  parser.add_argument("--repeats", type=int, default=3, help="interleaved passes")
  parser.add_argument("--quick", action="store_true",
                      help="W2 6 rounds and P1 2, 1 warm-up round, 1 pass; prints only")
  parser.add_argument("--venv", type=pathlib.Path, default=env.DEFAULT,
                      help=f"the peers' environment (default {env.DEFAULT})")
  parser.add_argument("--out", type=pathlib.Path, help="default bench/results_peers.md")
  args = parser.parse_args()
  workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
  frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
  for name, given, known in (("--workloads", workloads, sw.WORKLOADS),
                             ("--frameworks", frameworks, FRAMEWORKS)):
    unknown = [g for g in given if g not in known]
    if unknown or not given:
      parser.error(f"{name}: unknown {', '.join(unknown) or '(none given)'};"
                   f" choose from {', '.join(known)}")
  if args.quick:
    args.warmup, args.repeats = 1, 1
  if args.warmup < 1:
    parser.error("--warmup: at least 1 (round 1 includes compilation and start-up)")
  rounds_of = {w: (args.rounds or ({"W2": 6, "P1": 2}[w] if args.quick else ROUNDS[w]))
               for w in workloads}
  short = [w for w, r in rounds_of.items() if r <= args.warmup]
  if short:
    parser.error(f"--rounds: {', '.join(short)} would have no timed round after"
                 f" {args.warmup} warm-up round(s)")

  record = env.ensure(args.venv, log=lambda m: print(m, flush=True))
  peers_python = pathlib.Path(record["python"])
  versions = {k: record["versions"][k] for k in ("flwr", "pfl", "torch", "ray")}
  results, failed = {}, False
  for workload in workloads:
    rounds = rounds_of[workload]
    load_before, runs = os.getloadavg()[0], []
    for rep in range(args.repeats):
      for fw in frameworks:
        tag = f"{os.getpid()}-{workload}-{rep}-{fw}"
        print(f"{workload} pass {rep + 1}/{args.repeats}: {fw} ({rounds} rounds) ...",
              end=" ", flush=True)
        run = run_once(fw, workload, rounds, peers_python, tag)
        s = summarize(run, rounds, args.warmup)
        runs.append(s)
        if "error" in s or not s["loss_falls"]:
          failed = True
          print(s.get("error", f"loss did not fall: {s['loss']}"))
          print("\n".join("    " + l for l in run["tail"][-15:]))
        else:
          print(f"{fmt_ms(statistics.median(s['ms']))} ms/round, start-up"
                f" {s['startup_s']:.1f} s, loss {s['loss'][0]:.3f} -> {s['loss'][1]:.3f},"
                f" load {s['load']:.2f}", flush=True)
        if run["left_behind"]:
          print(f"    ended {run['left_behind']} process(es) the run left behind")
    results[workload] = (runs, rounds, (load_before, os.getloadavg()[0]))
  text = markdown(results, args, versions)
  print("\n" + text)
  out = args.out or (None if args.quick else REPO / "bench" / "results_peers.md")
  if out is not None:
    out.write_text(text)
    print(f"wrote {out}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
