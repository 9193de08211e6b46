"""Executors: where the runs of a study are played.

An executor takes the study's run directories that are to run (each already
holding the config.yaml it runs with, and resumable: see `runner`) and
yields one `Outcome` per run as it ends. A run always goes through the same
code: `fedsim.api.run` resuming its directory, here or in a child process
(`fedsim run --resume RUN_DIR`), so a run equals its sequential run bit for
bit whichever executor plays it (same config, same seeds, same rounds).

* `sequential`: one run after another in this process (the default).
* `processes`: up to `jobs` runs at once on `jobs` long-lived child
  processes (`fedsim.study.player`), each pinned to its share of this
  process's CPUs (TensorFlow sizes its thread pools by them, so N runs do not
  oversubscribe the machine) and playing its runs one after another as
  `fedsim run --resume RUN_DIR` would: a process's start-up (TensorFlow's
  import) is paid once per player, not once per run.
* `ray`: each run a Ray task on a cluster (`fedsim.study.on_ray`).

Every executor is a factory in `EXECUTORS`, built from the study's
`ExecutorChoice`, and follows the same contract: every run it is given ends
as an Outcome, or the study's KeyboardInterrupt / SystemExit propagates after
its runs were stopped resumable.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import pathlib
import select
import signal
import subprocess
import sys
import time
from typing import Callable, Iterator, Protocol, Sequence

from fedsim.errors import RunFailed, UserError
from fedsim.reporting.rundir import read_status
from fedsim.runtime.cluster.lifetime import TAG as RAY_INSTANCE_TAG
from fedsim.study.plan import PlannedRun
from fedsim.study.player import CHILD_LOG, PLAYER_ARGS

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
    on_start: called with each run as it starts.
  """

  logdir: str | os.PathLike
  progress: bool | None = None
  plugins: Sequence[str] = ()
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
  """Up to `jobs` runs at once, on `jobs` long-lived players (`fedsim.study.player`),
  each pinned to its CPU slot and playing one run after another."""

  def __init__(self, jobs: int):
    self._jobs = jobs

  def play(self, runs: Sequence[PlannedRun], context: StudyContext) -> Iterator[Outcome]:
    slots = cpu_slots(min(self._jobs, max(1, len(runs))))
    waiting = list(runs)
    players: dict[int, _Player] = {}  # slot -> its player (a new one after one died)
    try:
      while waiting or any(p.run is not None for p in players.values()):
        for slot, cpus in enumerate(slots):
          player = players.get(slot)
          if waiting and (player is None or player.run is None):
            if player is None or player.process.poll() is not None:
              player = players[slot] = _Player(cpus, context.plugins)
            run = waiting.pop(0)
            context.on_start(run)
            player.send(run)
        busy = {p.process.stdout: p for p in players.values() if p.run is not None}
        readable, _, _ = select.select(list(busy), [], [], 1.0)
        for stream in readable:
          player = busy[stream]
          run, code = player.answer()
          if stopped(code):
            raise KeyboardInterrupt  # by a signal the study did not get: stop the study
          if player.process.poll() is not None and code != 0 and not completed(run):
            yield Outcome(run, False, error=f"its process (pid {player.process.pid}) died with"
                                            f" exit code {code}; the run can resume from its"
                                            " last checkpoint")
          else:
            yield child_outcome(run, code)
    except BaseException:
      stop_children(p.process for p in players.values() if p.run is not None)
      raise
    finally:
      for player in players.values():
        player.close()


class _Player:
  """One player process (see `fedsim.study.player`) and the run it plays, if any."""

  def __init__(self, cpus: frozenset[int], plugins: Sequence[str]):
    self.run: PlannedRun | None = None
    self.process = _spawn([sys.executable, *PLAYER_ARGS, *(f"--plugin={p}" for p in plugins)],
                          cpus,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL)

  def send(self, run: PlannedRun) -> None:
    self.run = run
    self.process.stdin.write(f"{run.run_dir}\n".encode())
    self.process.stdin.flush()

  def answer(self) -> tuple[PlannedRun, int]:
    """The run played and its exit code (the player's own when it died)."""
    run, self.run = self.run, None
    line = self.process.stdout.readline()
    return run, int(line) if line.strip() else self.process.wait()

  def close(self) -> None:
    """Ends an idle player (its stdin closed); kills it if it does not end in time."""
    try:
      self.process.stdin.close()
    except OSError:
      pass
    try:
      self.process.wait(_CHILD_STOP_S)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()
    self.process.stdout.close()


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


def start_child(run_dir: pathlib.Path, plugins: Sequence[str],
                cpus: frozenset[int] | None = None) -> subprocess.Popen:
  """`fedsim run --resume RUN_DIR` as a child of this process (see `_spawn`),
  its output appended to RUN_DIR/output.log."""
  log = open(run_dir / CHILD_LOG, "ab")  # pylint: disable=consider-using-with
  try:
    return _spawn([sys.executable, "-m", "fedsim.cli", "run", "--resume", str(run_dir),
                   "--no-progress", *(f"--plugin={p}" for p in plugins)], cpus,
                  stdin=subprocess.DEVNULL, stdout=log, stderr=log)
  finally:
    log.close()


def _spawn(args: list[str], cpus: frozenset[int] | None, **streams) -> subprocess.Popen:
  """A child pinned to `cpus` (None: this process's), that gets SIGTERM (and
  ends its run 'interrupted') when this process dies, in its own process
  group: a terminal's Ctrl-C reaches the study, which stops each child once
  (`stop_children`)."""
  parent = os.getpid()

  def pin_and_tie() -> None:
    if cpus is not None:
      os.sched_setaffinity(0, cpus)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
      os.kill(os.getpid(), signal.SIGTERM)

  # Not a private Ray instance's process (see fedsim.runtime.cluster.lifetime):
  # when the instance is swept, a run started by its worker gets SIGTERM from
  # that worker's death and ends 'interrupted' instead of being SIGKILLed.
  env = {k: v for k, v in os.environ.items() if k != RAY_INSTANCE_TAG}
  return subprocess.Popen(args, preexec_fn=pin_and_tie, process_group=0,
                          env=dict(env, PYTHONUNBUFFERED="1"), **streams)


def stopped(code: int) -> bool:
  """Whether a child's exit code says it was stopped as Ctrl-C or SIGTERM stop a run."""
  return code in (130, 143, -signal.SIGINT, -signal.SIGTERM)


def completed(run: PlannedRun) -> bool:
  """Whether `run` recorded that it completed: a process or node lost after
  that (before it could answer) lost nothing of the run."""
  return read_status(run.run_dir)[0] == "completed"


def child_outcome(run: PlannedRun, code: int) -> Outcome:
  """The Outcome of `run` whose child exited with `code`."""
  if code == 0:
    return Outcome(run, True)
  return Outcome(run, False, error=f"exit code {code}; last line of {run.run_dir / CHILD_LOG}:"
                                   f" {_last_line(run.run_dir / CHILD_LOG)}")


def _last_line(path: pathlib.Path) -> str:
  try:
    lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
  except OSError:
    return "(unreadable)"
  return lines[-1] if lines else "(empty)"


def stop_children(children) -> None:
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


@dataclasses.dataclass(frozen=True)
class ExecutorChoice:
  """Which executor plays a study, with its options (checked by `choose`).

  Attributes:
    name: a key of `EXECUTORS`.
    jobs: `processes`: runs at once.
    address: `ray`: 'local' (a private instance fedsim starts and stops),
      'auto' (the cluster `ray start` made on this machine) or HOST:PORT.
    max_retries: `ray`: how often a run whose worker or node was lost is
      started again (resuming from its last checkpoint).
  """

  name: str = "sequential"
  jobs: int = 1
  address: str = "local"
  max_retries: int = 2


def choose(name: str | None, jobs: int = 1, address: str | None = None,
           max_retries: int | None = None) -> ExecutorChoice:
  """The executor the command line asks for: `name`, or `processes` when
  `jobs` > 1, else `sequential`.

  Raises:
    UserError: one line naming the flag: an unknown executor, or an option
      the chosen executor does not take.
  """
  if name is None:
    name = "processes" if jobs > 1 else "sequential"
  if name not in EXECUTORS:
    raise UserError(f"--executor: unknown executor '{name}'; choose one of:"
                    f" {', '.join(EXECUTORS)}")
  if jobs > 1 and name != "processes":
    raise UserError(f"--jobs: only with --executor processes (the {name} executor"
                    + (" runs as many runs at once as the cluster's CPUs hold)" if name == "ray"
                       else " plays one run at a time)"))
  for flag, value in (("--ray-address", address), ("--max-retries", max_retries)):
    if value is not None and name != "ray":
      raise UserError(f"{flag}: only with --executor ray")
  if max_retries is not None and max_retries < 0:
    raise UserError(f"--max-retries: {max_retries} is not a number of retries (0 or more)")
  defaults = ExecutorChoice()
  if address is not None:
    from fedsim.runtime.cluster.address import check_address  # TF-free
    check_address(address, "--ray-address")
  return ExecutorChoice(name, jobs, address or defaults.address,
                        defaults.max_retries if max_retries is None else max_retries)


def _on_ray(choice: ExecutorChoice) -> Executor:
  from fedsim.study.on_ray import OnRay  # Ray's import: only when chosen
  return OnRay(choice.address, choice.max_retries)


EXECUTORS: dict[str, Callable[[ExecutorChoice], Executor]] = {
    "sequential": lambda choice: Sequential(),
    "processes": lambda choice: Processes(choice.jobs),
    "ray": _on_ray,
}


def executor_for(choice: ExecutorChoice) -> Executor:
  """The executor `choice` names, built with its options."""
  return EXECUTORS[choice.name](choice)
