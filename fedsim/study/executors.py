"""Executors: where the runs of a study are played.

An executor takes the study's run directories that are to run (each already
holding the config.yaml it runs with, and resumable: see `runner`) and
yields one `Outcome` per run as it ends. A run always goes through the same
code: `fedsim.api.run` resuming its directory, here or in a child process
(`fedsim run --resume RUN_DIR`), so a run equals its sequential run bit for
bit whichever executor plays it (same config, same seeds, same rounds).

* `sequential`: one run after another in this process (the default).
* `processes`: up to `jobs` runs at once, each a child process pinned to its
  share of this process's CPUs (TensorFlow sizes its thread pools by them),
  so N runs do not oversubscribe the machine.

Another executor (e.g. one on a Ray cluster) registers a factory in
`EXECUTORS` and follows the same contract: every run it is given ends as an
Outcome, or the study's KeyboardInterrupt / SystemExit propagates after its
runs were stopped resumable.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Callable, Iterator, Protocol, Sequence

from fedsim.errors import RunFailed, UserError
from fedsim.study.plan import PlannedRun

# The log of a run played in a child process: what it printed.
CHILD_LOG = "output.log"
# A child asked to stop (SIGINT) gets this long to stop cleanly, then a second
# SIGINT makes it leave at once (marking its run interrupted), all within this
# process's own exit deadline (fedsim.runtime.signals.EXIT_DEADLINE_S).
_CHILD_STOP_S = 5.0
_CHILD_LEAVE_S = 2.0
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl


@dataclasses.dataclass(frozen=True)
class Outcome:
  """How one run of a study ended.

  Attributes:
    run: the planned run.
    ok: it completed.
    result: its RunResult when it ran in this process, else None.
    error: why it failed ('' when ok).
  """

  run: PlannedRun
  ok: bool
  result: object = None
  error: str = ""


@dataclasses.dataclass(frozen=True)
class StudyContext:
  """What every executor is told.

  Attributes:
    logdir: the log directory root.
    progress: progress bar on/off; None = only on a terminal.
    plugins: the `--plugin` modules or files the study was started with.
    jobs: runs at once (executors that play one at a time ignore it).
    on_start: called with each run as it starts.
  """

  logdir: str | os.PathLike
  progress: bool | None = None
  plugins: Sequence[str] = ()
  jobs: int = 1
  on_start: Callable[[PlannedRun], None] = lambda run: None


class Executor(Protocol):
  """Plays runs of a study (see the module docstring)."""

  def play(self, runs: Sequence[PlannedRun], context: StudyContext) -> Iterator[Outcome]:
    """Yields one Outcome per run of `runs`, in the order they end.

    Raises:
      KeyboardInterrupt, SystemExit: the study was interrupted; every run
        it had started is stopped, its status 'interrupted'.
    """


class Sequential:
  """Each run in turn, in this process."""

  def play(self, runs: Sequence[PlannedRun], context: StudyContext) -> Iterator[Outcome]:
    from fedsim import api
    for run in runs:
      context.on_start(run)
      try:
        result = api.run(run.run_dir / "config.yaml", ["seeds=[]"], logdir=context.logdir,
                         progress=context.progress, resume=run.run_dir)
      except RunFailed as e:  # this run only: the others still run
        yield Outcome(run, False, error=str(e))
        continue
      yield Outcome(run, True, result)


class Processes:
  """Up to `context.jobs` runs at once, each in a child `fedsim run --resume RUN_DIR`."""

  def play(self, runs: Sequence[PlannedRun], context: StudyContext) -> Iterator[Outcome]:
    slots = cpu_slots(context.jobs)
    waiting = list(runs)
    running: dict[int, tuple[subprocess.Popen, PlannedRun]] = {}  # slot -> child
    try:
      while waiting or running:
        for slot in range(len(slots)):
          if slot not in running and waiting:
            run = waiting.pop(0)
            context.on_start(run)
            running[slot] = (_start_child(run, slots[slot], context), run)
        ended = [slot for slot, (child, _) in running.items() if child.poll() is not None]
        if not ended:
          time.sleep(0.1)
        for slot in ended:
          child, run = running.pop(slot)
          yield _outcome(run, child.returncode)
    except BaseException:
      _stop(child for child, _ in running.values())
      raise


def cpu_slots(jobs: int) -> list[frozenset[int]]:
  """The CPUs of each of `jobs` children: this process's CPUs split evenly
  (a slot gets one CPU, shared, when there are more jobs than CPUs)."""
  if jobs < 1:
    raise UserError(f"--jobs: {jobs} is not a positive number of runs at once")
  cpus = sorted(os.sched_getaffinity(0))
  if jobs >= len(cpus):
    return [frozenset({cpus[i % len(cpus)]}) for i in range(jobs)]
  share = len(cpus) // jobs
  return [frozenset(cpus[i * share:(i + 1) * share]) for i in range(jobs)]


def _start_child(run: PlannedRun, cpus: frozenset[int], context: StudyContext) -> subprocess.Popen:
  parent = os.getpid()

  def pin_and_tie() -> None:
    os.sched_setaffinity(0, cpus)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # ends 'interrupted' if the study dies
    if os.getppid() != parent:
      os.kill(os.getpid(), signal.SIGTERM)

  args = [sys.executable, "-m", "fedsim.cli", "run", "--resume", str(run.run_dir),
          "--no-progress", *(f"--plugin={p}" for p in context.plugins)]
  log = open(run.run_dir / CHILD_LOG, "ab")  # pylint: disable=consider-using-with
  try:
    # Its own process group: a terminal's Ctrl-C reaches the study, which
    # stops each child once (see `_stop`).
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            preexec_fn=pin_and_tie, process_group=0,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
  finally:
    log.close()


def _outcome(run: PlannedRun, code: int) -> Outcome:
  if code == 0:
    return Outcome(run, True)
  if code in (130, 143, -signal.SIGINT, -signal.SIGTERM):
    raise KeyboardInterrupt  # stopped by a signal the study did not get: stop the study
  return Outcome(run, False, error=f"exit code {code}; last line of {run.run_dir / CHILD_LOG}:"
                                   f" {_last_line(run.run_dir / CHILD_LOG)}")


def _last_line(path: pathlib.Path) -> str:
  try:
    lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
  except OSError:
    return "(unreadable)"
  return lines[-1] if lines else "(empty)"


def _stop(children) -> None:
  """Stops each child as Ctrl-C would (once: they are in their own process
  groups), a second time if it is still alive `_CHILD_STOP_S` later, and
  SIGKILLs what is left after `_CHILD_LEAVE_S` more."""
  children = list(children)
  for wait_s in (_CHILD_STOP_S, _CHILD_LEAVE_S):
    for child in children:
      if child.poll() is None:
        child.send_signal(signal.SIGINT)
    deadline = time.monotonic() + wait_s
    for child in children:
      try:
        child.wait(max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        pass
  for child in children:
    if child.poll() is None:
      child.kill()
      child.wait()


EXECUTORS: dict[str, Callable[[], Executor]] = {"sequential": Sequential, "processes": Processes}


def executor_for(jobs: int) -> Executor:
  """`sequential` for one job at a time, else `processes`."""
  return EXECUTORS["sequential" if jobs == 1 else "processes"]()
