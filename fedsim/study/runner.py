"""`fedsim run CONFIG`: plan the study, check every run, play those not complete.

* Fresh (the default): every run of the config gets a new run directory.
* Resume: each run continues in the directory the plan names (see
  `fedsim.study.plan`): a complete run is left alone, an interrupted or
  failed one continues from its checkpoint, one that never started starts.
  A run live in another process is left to it.

Every run to play is checked before the first one starts (its config may
differ from its checkpointed config only in `rounds` / `checkpoint`; its
checkpoints and logs must read): a study that cannot resume is refused in one
line before anything runs.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Callable, Mapping, Sequence

from fedsim.errors import UserError
from fedsim.experiment.config.loader import expand_variants, load_config, plain
from fedsim.experiment.config.variant_overrides import load_for_variant
from fedsim.experiment.resume import check_resumable, check_same_config
from fedsim.reporting.ownership import lock_run_dir, wait_released
from fedsim.reporting.rundir import read_status, write_config
from fedsim.study.executors import ExecutorChoice, Outcome, StudyContext, executor_for
from fedsim.study.plan import PlannedRun, plan_study, read_plan


_ENDING_S = 5.0


@dataclasses.dataclass
class StudyRun:
  """What a `run_study` did.

  Attributes:
    study_dir: `<logdir>/<name>`.
    planned: every run of this study, in config order.
    complete: the runs left alone (complete before it started).
    live: the runs left to the other process running them.
    outcomes: the runs played, in the order they ended.
  """

  study_dir: pathlib.Path
  planned: list[PlannedRun]
  complete: list[PlannedRun] = dataclasses.field(default_factory=list)
  live: list[PlannedRun] = dataclasses.field(default_factory=list)
  outcomes: list[Outcome] = dataclasses.field(default_factory=list)

  @property
  def failed(self) -> list[Outcome]:
    return [o for o in self.outcomes if not o.ok]


def run_study(config: str | os.PathLike | Mapping[str, Any], overrides: Sequence[str] = (), *,
              logdir: str | os.PathLike = "runs", variant: str | None = None,
              resume: bool = False, executor: ExecutorChoice = ExecutorChoice(),
              progress: bool | None = None,
              plugins: Sequence[str] = (), study_name: str | None = None,
              on_plan: Callable[[pathlib.Path], None] = lambda study_dir: None,
              on_start: Callable[[PlannedRun], None] = lambda run: None) -> StudyRun:
  """Plans the study of `config` (all its runs, or `variant`'s) and plays it.

  Args:
    config, overrides, variant: as `fedsim.api.run`.
    logdir: root of the study directory `<logdir>/<name>/`.
    resume: continue the study's runs instead of starting new directories.
    executor: which executor plays the runs (default: one after another in
      this process), with its options.
    progress: progress bar on/off; None = only on a terminal.
    plugins: `--plugin` modules or files (passed on to child processes).
    study_name: the study directory's name the config must have (`--resume
      DIR` with CONFIG), else any.
    on_plan: called with the study directory once the plan is written.
    on_start: called with each run as it starts.

  Returns:
    What ran (a run that fails does not stop the others: see `StudyRun.failed`).

  Raises:
    UserError: bad input, or a run that cannot continue (nothing has run).
    KeyboardInterrupt, SystemExit: interrupted; the runs started are
      'interrupted' and the study resumable.
  """
  raw = load_for_variant(config, overrides, variant)
  runs = expand_variants(raw, only=variant)
  name = runs[0][1].name
  if study_name is not None and name != study_name:
    raise UserError(f"--resume {pathlib.Path(logdir) / study_name}: a study of another"
                    f" experiment (this config's name is '{name}')")
  resolved = [(label, _resolved(cfg)) for label, cfg in runs]
  planned = plan_study(logdir, name, resolved, resume)
  study = StudyRun(pathlib.Path(logdir) / name, planned)
  on_plan(study.study_dir)
  _play(study, [config_of_run for _, config_of_run in resolved], executor,
        StudyContext(logdir=logdir, progress=progress, plugins=tuple(plugins),
                     on_start=on_start))
  return study


def resume_study(study_dir: str | os.PathLike, overrides: Sequence[str] = (), *,
                 executor: ExecutorChoice = ExecutorChoice(), progress: bool | None = None,
                 plugins: Sequence[str] = (),
                 on_plan: Callable[[pathlib.Path], None] = lambda study_dir: None,
                 on_start: Callable[[PlannedRun], None] = lambda run: None) -> StudyRun:
  """Continues the study `study_dir/study.yaml` plans, each run with its own
  config.yaml (and `overrides`, e.g. `rounds=200` to extend every run).

  Raises:
    UserError: no plan there, or a run that cannot continue; see `run_study`.
  """
  study_dir = pathlib.Path(study_dir)
  planned = read_plan(study_dir)
  if not planned:
    raise UserError(f"--resume {study_dir}: no study here (no study.yaml); give a run"
                    " directory, or CONFIG.yaml with --resume")
  study = StudyRun(study_dir, planned)
  on_plan(study_dir)
  configs = []
  for run in planned:
    _, raw = load_config(run.run_dir / "config.yaml", ["seeds=[]", *overrides])
    (_, cfg), = expand_variants(raw)
    configs.append(_resolved(cfg))
  _play(study, configs, executor, StudyContext(logdir=study_dir.parent, progress=progress,
                                               plugins=tuple(plugins), on_start=on_start))
  return study


def _play(study: StudyRun, configs: Sequence[Mapping[str, Any]], executor: ExecutorChoice,
          context: StudyContext) -> None:
  """Sorts `study.planned` (each with its resolved config) into complete, live
  and to play, all checked before the first plays; then plays them."""
  # A run whose process is still ending (its study was stopped a moment ago,
  # on another node perhaps) is waited for before it is taken for another
  # process's live run and left alone.
  wait_released([run.run_dir for run in study.planned], _ENDING_S)
  to_play = []
  for run, resolved in zip(study.planned, configs):
    state = _prepare(run, resolved)
    {"complete": study.complete, "live": study.live, "play": to_play}[state].append(run)
  for outcome in executor_for(executor).play(to_play, context):
    study.outcomes.append(outcome)


def _resolved(cfg) -> dict[str, Any]:
  resolved = plain(cfg)
  resolved.pop("variants", None)
  return resolved


def _prepare(run: PlannedRun, resolved: Mapping[str, Any]) -> str:
  """'complete', 'live', or 'play' once `run`'s config.yaml says `resolved`.

  Raises:
    UserError: the run cannot continue with `resolved` (see `check_resumable`).
  """
  try:
    lock = lock_run_dir(run.run_dir)
  except UserError:
    return "live"  # Another process runs it (its lock names the process).
  with lock:
    status, _ = read_status(run.run_dir)
    if status == "completed" and _rounds_logged(run.run_dir) >= resolved["rounds"]:
      check_same_config(run.run_dir, resolved)   # a --set it would ignore is refused
      return "complete"
    check_resumable(run.run_dir, resolved, lock)
    write_config(run.run_dir, resolved)  # differs at most in rounds / checkpoint.*
  return "play"


def _rounds_logged(run_dir: pathlib.Path) -> int:
  from fedsim.run_status import run_status
  return run_status(run_dir).rounds_done
