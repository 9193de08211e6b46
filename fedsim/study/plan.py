"""The plan of a study: which run directory holds each run of the experiment.

A run is named by its label: '<variant>-seed<N>', '<variant>', 'seed<N>', or
None for a config without variants or seeds (see
`fedsim.experiment.config.loader.per_seed`). `<logdir>/<name>/study.yaml`
maps each label to its directory; every directory is created (with its
config.yaml) when the study is planned, so a run that never started is
already there to be started by a resume and listed by `fedsim status`.

A plan accumulates: a later `fedsim run` of the same experiment replaces the
entries of the runs it makes and keeps the others, so the plan always names
the newest directory of every run of the experiment.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Mapping, Sequence

import yaml

from fedsim.errors import UserError
from fedsim.experiment.resume import belongs
from fedsim.reporting.rundir import (STUDY_FILE, create_run_dir, read_status, write_config,
                                     write_text_atomic)
from fedsim.state.checkpoint import latest_checkpoint

_HEADER = ("# The runs of this experiment, one directory each (written by `fedsim run`);\n"
           "# `fedsim run --resume <this directory>` continues them, `fedsim status` lists them.\n")


@dataclasses.dataclass(frozen=True)
class PlannedRun:
  """One run of a study.

  Attributes:
    label: '<variant>-seed<N>', '<variant>', 'seed<N>', or None (the
      experiment's only run).
    run_dir: its run directory.
  """

  label: str | None
  run_dir: pathlib.Path

  def name(self) -> str:
    """The label, or the run directory's name for the experiment's only run."""
    return self.label if self.label is not None else self.run_dir.name


def is_study_dir(path: str | os.PathLike) -> bool:
  """Whether `path` holds a study plan."""
  return (pathlib.Path(path) / STUDY_FILE).is_file()


def read_plan(study_dir: str | os.PathLike) -> list[PlannedRun]:
  """The runs `study_dir/study.yaml` lists ([] without the file).

  Raises:
    UserError: naming the file, when it exists but does not read as a plan.
  """
  study_dir = pathlib.Path(study_dir)
  path = study_dir / STUDY_FILE
  try:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
  except FileNotFoundError:
    return []
  except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
    raise UserError(f"{path}: unreadable study plan ({e.__class__.__name__})") from None
  runs = data.get("runs") if isinstance(data, Mapping) else None
  if not isinstance(runs, list) or not all(
      isinstance(r, Mapping) and isinstance(r.get("dir"), str) and "/" not in r["dir"]
      and (r.get("run") is None or isinstance(r.get("run"), str)) for r in runs):
    raise UserError(f"{path}: expected `runs:` as a list of {{run: LABEL, dir: NAME}}")
  return [PlannedRun(r.get("run"), study_dir / r["dir"]) for r in runs]


def write_plan(study_dir: pathlib.Path, runs: Sequence[PlannedRun]) -> None:
  """Writes `study_dir/study.yaml` (atomically). Raises OSError."""
  rows = [{"run": r.label, "dir": r.run_dir.name} for r in runs]
  write_text_atomic(study_dir / STUDY_FILE,
                    _HEADER + yaml.safe_dump({"runs": rows}, sort_keys=False))


def plan_study(logdir: str | os.PathLike, name: str,
               runs: Sequence[tuple[str | None, Mapping[str, Any]]],
               resume: bool) -> list[PlannedRun]:
  """The run directory of each (label, resolved config) of `runs`, and the plan written.

  New runs get a new directory holding their config.yaml. With `resume`, a
  run keeps the directory the plan names for it; a run the plan does not
  name (a study planned by an older fedsim, or a variant added since) takes
  its newest directory under `<logdir>/<name>/` (incomplete with a
  checkpoint first, then incomplete, then any), or a new one if it has none.

  Returns:
    The planned runs, in the order of `runs`.

  Raises:
    UserError: a directory cannot be created, or the plan is unreadable.
    OSError: a file cannot be written.
  """
  study_dir = pathlib.Path(logdir) / name
  known = {r.label: r for r in read_plan(study_dir)}
  if resume and not known and not any(
      _newest_run_dir(study_dir, label) is not None for label, _ in runs):
    raise UserError(f"--resume: no run of {name} under {study_dir} to resume; leave out"
                    " --resume to start the study")
  planned = []
  for label, resolved in runs:
    run = known.get(label) if resume else None
    if run is not None and not (run.run_dir / "config.yaml").is_file():
      run = None  # deleted by hand since: planned again
    if run is None and resume:
      existing = _newest_run_dir(study_dir, label)
      run = PlannedRun(label, existing) if existing is not None else None
    if run is None:
      run = PlannedRun(label, create_run_dir(logdir, name, label))
      write_config(run.run_dir, resolved)
    planned.append(run)
  mine = {r.label for r in planned}
  write_plan(study_dir, planned + [r for r in known.values() if r.label not in mine])
  return planned


def _newest_run_dir(study_dir: pathlib.Path, label: str | None) -> pathlib.Path | None:
  if not study_dir.is_dir():
    return None
  candidates = [d for d in study_dir.iterdir()
                if d.is_dir() and belongs(d.name, label) and (d / "config.yaml").is_file()]

  def preference(d: pathlib.Path):
    incomplete = _status(d) != "completed"
    return (incomplete, incomplete and latest_checkpoint(d) is not None,
            (d / "config.yaml").stat().st_mtime)
  return max(candidates, key=preference, default=None)


def _status(run_dir: pathlib.Path) -> str:
  try:
    return read_status(run_dir)[0]
  except UserError:
    return "unreadable"
