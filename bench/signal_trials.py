"""SIGINT and SIGTERM at random moments of `fedsim run`, with both cores busy (issue 27).

    uv run python bench/signal_trials.py [--trials N] [--runtimes local,inprocess,ray]
                                         [--signals INT,TERM] [--no-load] [--seed S]

Starts one busy-loop process per core (`--no-load`: none), then for each
runtime and signal runs N trials of

    fedsim run experiments/quickstart.yaml --set rounds=20000 --set checkpoint.every=5
        --set runtime=... --logdir TMP

and sends the signal at a uniformly random moment: in odd trials 1-25 s
after the start, in even ones 0-10 s after the run directory appears (on two
loaded cores start-up alone takes 20-60 s, so the first kind mostly lands in
start-up, the second in the first compile, rounds, evaluation, TensorBoard
writes and checkpoints). SIGINT goes to the trial's process group, as a
terminal's Ctrl-C; SIGTERM to fedsim's process, as `kill`.
A trial passes when fedsim exits 130 / 143 within 60 s, `fedsim status` calls
its run `interrupted` (a signal before the run directory exists leaves none,
and one while the run is only planned leaves it `not started`: `fedsim run`
writes the plan, with the run's directory, before it builds the run; both are
counted, shown as `before start`), its stderr holds no "Traceback" and no
"Exception ignored", and 5 s later no process it started is alive (TFF
worker, Ray's GCS, raylet, agents, actors: every process whose environment
holds the trial's marker). Prints a table, runtime x signal -> passed/N, and
each failure's reason and first stderr lines. The load processes are killed
at the end whatever happens. `ray` runs `address: local` (a private instance).
Takes ~20 s a trial for local/inprocess, longer for ray; 20 trials of all six
cells ~1 hour on 2 cores.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import datetime
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.chaos.processes import MARKER, kill_marked, left_after  # noqa: E402

RUNTIMES = {"local": "{name: local}", "inprocess": "{name: inprocess}",
            "ray": "{name: ray, address: local}"}
EXPECTED = {"INT": 130, "TERM": 143}
EXIT_TIMEOUT_S = 60
# `fedsim status` of a run the plan made that never started (no status, no rounds).
_PLANNED = "not started"
START_TIMEOUT_S = 300
_load: list[subprocess.Popen] = []


def start_load(processes: int) -> None:
  """`processes` busy loops, each its own session (a trial's Ctrl-C does not reach them)."""
  for _ in range(processes):
    _load.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                  start_new_session=True))


def stop_load() -> None:
  while _load:
    proc = _load.pop()
    proc.kill()
    proc.wait()


def trial(runtime: str, sig: str, anchor: str, delay: float, root: pathlib.Path) -> dict:
  """One run, signalled `delay` s after its `anchor` ('start', or 'run': its run
  directory appeared); a dict of what was seen."""
  marker = uuid.uuid4().hex
  logdir = root / f"{runtime}-{sig}-{marker[:8]}"
  env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", **{MARKER: marker})
  proc = subprocess.Popen(
      [sys.executable, "-m", "fedsim.cli", "run", "experiments/quickstart.yaml",
       "--set", "rounds=20000", "--set", "checkpoint.every=5",
       "--set", f"runtime={RUNTIMES[runtime]}", "--logdir", str(logdir)],
      cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, env=env, start_new_session=True,
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal's job
  seen = {"runtime": runtime, "signal": sig, "anchor": anchor, "delay": delay, "problems": []}
  try:
    deadline = time.monotonic() + START_TIMEOUT_S
    while anchor == "run" and not list(logdir.glob("quickstart/*")):
      if proc.poll() is not None or time.monotonic() > deadline:
        break  # then the signal (or the report) tells what happened
      time.sleep(0.05)
    try:
      proc.communicate(timeout=delay)
      seen["problems"].append(f"ended by itself before the signal (exit {proc.returncode})")
    except subprocess.TimeoutExpired:
      if sig == "INT":
        os.killpg(proc.pid, signal.SIGINT)
      else:
        proc.send_signal(signal.SIGTERM)
    try:
      _, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      _, err = proc.communicate()
      seen["problems"].append(f"still running {EXIT_TIMEOUT_S} s after the signal")
    seen["exit"], seen["stderr"] = proc.returncode, err
    if proc.returncode != EXPECTED[sig]:
      seen["problems"].append(f"exit {proc.returncode}")
    for bad in ("Traceback", "Exception ignored"):
      if bad in err:
        seen["problems"].append(f"'{bad}' on stderr")
    left = left_after(marker, 5)
    if left:
      seen["problems"].append("left running: " + "; ".join(c[:60] for _, c in left))
    run_dirs = sorted(p for p in logdir.glob("quickstart/*") if p.is_dir())
    if not run_dirs:
      seen["status"] = "before run dir"
    else:
      status = subprocess.run([sys.executable, "-m", "fedsim.cli", "status", str(run_dirs[0])],
                              cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
      seen["status"] = status.stdout.strip().split(": ", 1)[-1]
      if not seen["status"].startswith(("interrupted", _PLANNED)):
        seen["problems"].append(f"status: {seen['status']}")
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()
    kill_marked(marker)
  return seen


def _last_line(seen: dict) -> str:
  """fedsim's own last line of stderr (its one-line error), else the last line."""
  lines = (seen.get("stderr") or "").strip().splitlines() or [""]
  ours = [line for line in lines if line.startswith("fedsim:")]
  return (ours or lines)[-1][:200]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--trials", type=int, default=20)
  parser.add_argument("--runtimes", default="local,inprocess,ray")
  parser.add_argument("--signals", default="INT,TERM")
  parser.add_argument("--no-load", action="store_true", help="no busy-loop processes")
  parser.add_argument("--seed", type=int, default=27)
  args = parser.parse_args()
  # SIGTERM to this script still runs the finally below (and atexit) and stops the load.
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
  atexit.register(stop_load)
  rng = random.Random(args.seed)
  cells = [(r, s) for r in args.runtimes.split(",") for s in args.signals.split(",")]
  results = collections.defaultdict(list)
  started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
  try:
    if not args.no_load:
      start_load(os.cpu_count() or 2)
    with tempfile.TemporaryDirectory(prefix="fedsim-signals-") as root:
      for runtime, sig in cells:
        for number in range(args.trials):
          anchor, delay = ("start", rng.uniform(1, 25)) if number % 2 == 0 else (
              "run", rng.uniform(0, 10))
          seen = trial(runtime, sig, anchor, delay, pathlib.Path(root))
          results[runtime, sig].append(seen)
          print(f"{runtime:9} SIG{sig:4} #{number + 1:2} {delay:4.1f} s after {anchor:5}:"
                f" exit {seen.get('exit')}, {seen.get('status', '?')[:50]}"
                + (f"  FAILED: {'; '.join(seen['problems'])}: {_last_line(seen)}"
                   if seen["problems"] else ""), flush=True)
  finally:
    stop_load()
  load = "none" if args.no_load else f"{os.cpu_count()} busy-loop processes"
  print(f"\n{started}, {os.cpu_count()} cores, load: {load}\n")
  print("| runtime | signal | passed | before start |\n|---|---|---|---|")
  for (runtime, sig), seen in results.items():
    passed = sum(not s["problems"] for s in seen)
    early = sum(s.get("status", "").startswith(("before run dir", _PLANNED)) for s in seen)
    print(f"| {runtime} | SIG{sig} (exit {EXPECTED[sig]}) | {passed}/{len(seen)} | {early} |")
  for seen in [s for cell in results.values() for s in cell if s["problems"]]:
    lines = (seen.get("stderr") or "").strip().splitlines()[:3]
    print(f"\n{seen['runtime']} SIG{seen['signal']} {seen['delay']:.1f} s after"
          f" {seen['anchor']}:"
          f" {'; '.join(seen['problems'])}\n  " + "\n  ".join(lines + [_last_line(seen)]))
  return 0 if all(not s["problems"] for cell in results.values() for s in cell) else 1


if __name__ == "__main__":
  sys.exit(main())
