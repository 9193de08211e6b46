"""`fedsim status`: what happened to runs, read from their directories only.

A run directory holds its `status` file (running, completed, failed,
interrupted, with the reason, and which process wrote it), its metrics.csv and
its checkpoints; this reads them without TensorFlow and without the run's
process, so it answers for a run that is still going, one that was killed
(on this host, a 'running' run whose process is gone reads as 'killed'), or
one on another machine's disk.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time
from typing import Sequence

from fedsim import invocation
from fedsim.errors import UserError
from fedsim.metric_names import EVAL_ACCURACY, TRAIN_LOSS
from fedsim.reporting.ownership import parse_writer
from fedsim.reporting.rundir import read_status
from fedsim.reporting.run_records import read_run_config
from fedsim.reporting.sinks import read_metrics_csv
from fedsim.state.checkpoint import intact_checkpoints

# Why a failed run would fail again from its checkpoint: the same rounds
# replay the same arithmetic (fedsim.experiment.round_result).
_REPEATS = ("training diverged",)


@dataclasses.dataclass(frozen=True)
class RunStatus:
  """One run directory's state.

  Attributes:
    run_dir: the directory.
    status: 'running', 'completed', 'failed', 'interrupted', 'killed' (its
      status says running but its process is gone), 'not started' (a planned
      run: no status, no metrics, no checkpoint), 'unknown' when it has no
      status file but logged something, or 'unreadable' when one of its
      files is.
    message: why it failed or stopped, from the status file ('' if none), or
      which file is unreadable and why.
    rounds_done: the last round in metrics.csv (0 if none).
    rounds: the configured number of rounds (None if config.yaml is unreadable:
      named in `damaged`, and the run cannot be resumed).
    checkpoint: the round of the newest complete checkpoint (None if none):
      where `fedsim run --resume` continues.
    idle_seconds: seconds since the run last wrote metrics.csv or its status.
    damaged: one line per damaged file (also at the head of `message`).
    pid: the process writing it, while 'running' (None otherwise).
    last_metric: (name, value) of its last eval/accuracy, else train/loss
      (None before its first round).
    no_intact_checkpoint: it has checkpoints and every one is damaged.
  """

  run_dir: pathlib.Path
  status: str
  message: str
  rounds_done: int
  rounds: int | None
  checkpoint: int | None
  idle_seconds: float
  damaged: tuple[str, ...] = ()
  pid: int | None = None
  last_metric: tuple[str, float] | None = None
  no_intact_checkpoint: bool = False

  @property
  def resumable(self) -> bool:
    """Whether `fedsim run --resume` can continue it: it stopped (not
    completed, not live), its logs read, a checkpoint is intact or none was
    ever written (it restarts), and its failure is not one a replay repeats."""
    if self.status in ("completed", "running", "unreadable") or self.no_intact_checkpoint:
      return False
    if self.rounds is None or any("metrics.csv" in reason for reason in self.damaged):
      return False
    return not (self.status == "failed" and any(r in self.message for r in _REPEATS))

  def line(self) -> str:
    """One line: directory, status, progress, resume point, and why."""
    total = f" of {self.rounds}" if self.rounds is not None else ""
    parts = [f"{self.run_dir}: {self.status}", f"round {self.rounds_done}{total}"]
    if self.status != "completed":
      parts.append(f"checkpoint at round {self.checkpoint}" if self.checkpoint is not None
                   else "no checkpoint")
    if self.status == "running":
      # A run on another host may have been killed there: a long silence says so.
      parts.append(f"last write {_duration(self.idle_seconds)} ago")
    text = ", ".join(parts)
    message = self.message
    if self.status == "killed" and self.resumable:  # it could not say so itself
      resume = invocation.command("fedsim", ["run", "--resume", str(self.run_dir)])
      message += f"; resume with: {resume}"
    return f"{text}: {message}" if message else text


def run_status(run_dir: str | os.PathLike, now: float | None = None) -> RunStatus:
  """The state of one run directory (see `RunStatus`).

  A damaged status file, metrics.csv or checkpoint is named in the message
  (one damaged run does not hide the others of a listing), and what still
  reads is reported: the newest intact checkpoint, the rounds it holds. Only
  a run whose status file is unreadable is 'unreadable'.
  """
  run_dir = pathlib.Path(run_dir)
  metrics = run_dir / "metrics.csv"
  damaged = []
  try:
    status, message = read_status(run_dir)
  except UserError as e:
    status, message = "unreadable", ""
    damaged.append(str(e))
  try:
    # A completed run wrote whole lines (a failed one may have been cut off by a full disk).
    rows = (read_metrics_csv(metrics, complete=status == "completed") if metrics.is_file()
            else [])
  except UserError as e:
    rows = []
    damaged.append(str(e))
  rounds, config_damage = _configured_rounds(run_dir)
  if config_damage:
    damaged.append(config_damage)
  checkpoint, bad_checkpoints = intact_checkpoints(run_dir)
  status = status or ("not started" if not rows and checkpoint is None and not bad_checkpoints
                      and not metrics.is_file() else "unknown")
  damaged.extend(f"damaged checkpoint {reason}" for reason in bad_checkpoints)
  if damaged:
    message = "; ".join([*damaged, *([message] if message else [])])
  written = [p.stat().st_mtime for p in (metrics, run_dir / "status") if p.is_file()]
  now = time.time() if now is None else now
  # metrics.csv may be the damaged file: the checkpoint still says how far it got.
  done = int(rows[-1]["round"]) if rows else (checkpoint.round_num if checkpoint else 0)
  return RunStatus(run_dir=run_dir, status=status, message=message,
                   rounds_done=done, rounds=rounds,
                   checkpoint=checkpoint.round_num if checkpoint else None,
                   idle_seconds=max(0.0, now - max(written)) if written else 0.0,
                   damaged=tuple(damaged),
                   pid=_writer_pid(run_dir) if status == "running" else None,
                   last_metric=_last_metric(rows),
                   no_intact_checkpoint=checkpoint is None and bool(bad_checkpoints))


def status_table(statuses: Sequence[RunStatus], names: Sequence[str] | None = None) -> str:
  """One aligned table, a row per run: run (`names`, else the directory),
  state, round reached of total, last metric, pid while running, and why it
  stopped or what is damaged."""
  header = ("run", "state", "round", "last metric", "pid", "why")
  rows = [header]
  for i, s in enumerate(statuses):
    metric = f"{s.last_metric[0]} {s.last_metric[1]:.4f}" if s.last_metric else "-"
    total = s.rounds if s.rounds is not None else "?"
    rows.append((names[i] if names is not None else str(s.run_dir), s.status,
                 f"{s.rounds_done}/{total}", metric, str(s.pid) if s.pid else "-",
                 s.message.replace("\n", " ") or "-"))
  widths = [max(len(row[c]) for row in rows) for c in range(len(header) - 1)]
  return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]])
                   for row in rows)


def _writer_pid(run_dir: pathlib.Path) -> int | None:
  try:
    lines = (run_dir / "status").read_text(encoding="utf-8").strip().splitlines()
  except (OSError, UnicodeDecodeError):
    return None
  writer = parse_writer(lines[-1]) if lines else None
  return writer.pid if writer else None


def _last_metric(rows) -> tuple[str, float] | None:
  for name in (EVAL_ACCURACY, TRAIN_LOSS):
    values = [row[name] for row in rows if row.get(name) is not None and row[name] == row[name]]
    if values:
      return name, float(values[-1])
  return None


def find_runs(path: str | os.PathLike) -> list[pathlib.Path]:
  """Run directories at `path`: itself, or those under it (up to two levels:
  `<logdir>/<name>/<run>`), sorted.

  Raises:
    UserError: `path` does not exist or holds no run directory.
  """
  path = pathlib.Path(path)
  if not path.is_dir():
    raise UserError(f"{path}: {'not a directory' if path.exists() else 'no such directory'}")
  if _is_run(path):
    return [path]
  runs = sorted(d for d in (*path.glob("*"), *path.glob("*/*")) if d.is_dir() and _is_run(d))
  if not runs:
    raise UserError(f"{path}: no fedsim run directories (with config.yaml) here or below")
  return runs


def _is_run(path: pathlib.Path) -> bool:
  return (path / "config.yaml").is_file()


def _configured_rounds(run_dir: pathlib.Path) -> tuple[int | None, str]:
  """(rounds its config.yaml sets, '') or (None, why it does not say): a run
  without a readable config cannot be resumed, nor compared."""
  path = run_dir / "config.yaml"
  try:
    rounds = read_run_config(path).get("rounds")
  except UserError as e:
    return None, str(e)
  if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
    return None, f"{path}: no number of rounds (rounds: {rounds!r})"
  return rounds, ""


def _duration(seconds: float) -> str:
  if seconds < 120:
    return f"{seconds:.0f} s"
  if seconds < 7200:
    return f"{seconds / 60:.0f} min"
  return f"{seconds / 3600:.1f} h"
