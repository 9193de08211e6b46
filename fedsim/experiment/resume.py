"""Which run directory a `fedsim run` continues, and whether it may.

* By default a run starts a new run directory; nothing is deleted.
* `resume=True` continues the newest incomplete run of the same experiment
  and variant (`<logdir>/<name>/` runs whose status is not 'completed') that
  has a complete checkpoint, else restarts the newest incomplete run from
  round 0, and insists on one; `resume=<run dir>` names the run (a completed
  run may then be extended by raising `rounds`).
* A run directory is locked (`fedsim.reporting.ownership`) before anything in
  it is read: a run that another process is running is never taken over.
* `fresh=True` says the default explicitly (it excludes `resume`).

The config of a resumed run must equal the checkpointed one (its
`config.yaml`) in everything but `rounds` and the `checkpoint` section, which
change neither results nor the state's structure; otherwise the resumed run
would silently mix two experiments.

A resume continues from the newest checkpoint whose files match their
manifest (`fedsim.state.checkpoint_manifest`): damaged newer ones are renamed
`damaged_round_<R>` (kept for inspection, never read again) and one line says
so; with none intact it refuses rather than restart and cut the logs. The
run's text logs must decode as UTF-8 before anything is rewound. Imports no
TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import sys
from typing import Any, Mapping

import yaml

from fedsim.errors import UserError
from fedsim.reporting.ownership import RunDirLock, lock_run_dir
from fedsim.reporting.rundir import read_status
from fedsim.state.checkpoint import Checkpoint, intact_checkpoints, latest_checkpoint

# Keys whose change does not alter what a round computes. `seeds` lists the
# sibling runs (this run's is `seed`); `plugins` says where the registered
# names come from (config.yaml records absolute paths, older ones relative).
MAY_DIFFER = ("rounds", "checkpoint", "seeds", "plugins")
_TIMESTAMPED = re.compile(r"\d{8}-\d{6}(-\d+)?")
# What a resume reads or rewinds as text: a byte that is not UTF-8 in them is
# refused in one line before anything is rewritten.
_TEXT_LOGS = ("config.yaml", "metrics.csv", "clients.csv", "events.log")


@dataclasses.dataclass(frozen=True)
class Resumption:
  """A run directory to continue, held by this process.

  Attributes:
    run_dir: the directory.
    checkpoint: where to continue; None to restart from round 0 (the run
      stopped before its first checkpoint).
    lock: the directory's lock, taken before anything in it was read; the
      caller releases it when the run ends.
  """

  run_dir: pathlib.Path
  checkpoint: Checkpoint | None
  lock: RunDirLock = dataclasses.field(compare=False, repr=False)


def config_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
  """Dotted keys whose values differ between two plain configs (sorted)."""
  if isinstance(old, Mapping) and isinstance(new, Mapping):
    out = []
    for key in sorted(set(old) | set(new), key=str):
      name = f"{prefix}{key}"
      if key not in old or key not in new:
        out.append(name)
      else:
        out.extend(config_differences(old[key], new[key], f"{name}."))
    return out
  return [] if old == new else [prefix.rstrip(".") or "<config>"]


def _with_current_defaults(old: Mapping[str, Any]) -> Mapping[str, Any]:
  """`old` plus the keys added to fedsim since it was written, at their defaults
  (which keep the old behaviour), so a run written by an older fedsim still
  resumes. Keys `old` has are compared as written; a config this fedsim no
  longer accepts is compared as it is, and its differences are reported."""
  from fedsim.experiment.config.legacy import without_old_runtime_defaults
  from fedsim.experiment.config.loader import parse_config, plain
  old = without_old_runtime_defaults(old)
  try:
    again = plain(parse_config(old))
  except (UserError, TypeError, ValueError):
    return old
  return _fill_missing(old, again)


def _fill_missing(old: Any, defaults: Any) -> Any:
  if not (isinstance(old, Mapping) and isinstance(defaults, Mapping)):
    return old
  filled = {key: _fill_missing(value, defaults.get(key)) for key, value in old.items()}
  filled.update({key: value for key, value in defaults.items()
                 if key not in old and key != "variants"})
  return filled


def belongs(run_name: str, variant: str | None) -> bool:
  """Whether a run directory named `run_name` holds a run of `variant`."""
  # create_run_dir names a variant's runs '<variant>', '<variant>-1', ... and
  # other runs by their start time.
  if variant is None:
    return bool(_TIMESTAMPED.fullmatch(run_name))
  return bool(re.fullmatch(re.escape(variant) + r"(-\d+)?", run_name))


def _incomplete_runs(logdir: str | os.PathLike, name: str, variant: str | None):
  parent = pathlib.Path(logdir) / name
  if not parent.is_dir():
    return []
  runs = [d for d in parent.iterdir()
          if d.is_dir() and belongs(d.name, variant) and (d / "config.yaml").is_file()
          and read_status(d)[0] != "completed"]
  return sorted(runs, key=lambda d: (d / "config.yaml").stat().st_mtime, reverse=True)


def check_resumable(run_dir: pathlib.Path, resolved: Mapping[str, Any],
                    lock: RunDirLock | None = None) -> Resumption:
  """Locks `run_dir` (unless `lock` holds it already) and checks that it can
  continue with config `resolved`.

  Returns:
    The Resumption (holding the lock): from the newest complete checkpoint,
    or from round 0 for a run that stopped before its first.

  Raises:
    UserError: naming the directory, if another process runs it, it is not a
      run directory, it already ran `rounds` rounds (or completed without a
      checkpoint to extend from), or was run with a config that differs in
      other keys than `rounds` / `checkpoint.*` (listed, dotted). The lock
      is then released.
  """
  if not (run_dir / "config.yaml").is_file():  # Checked first: no lock file left there.
    raise UserError(f"--resume {run_dir}: not a fedsim run directory (no readable config.yaml)")
  lock = lock or lock_run_dir(run_dir)
  try:
    return Resumption(run_dir, _checkpoint_to_resume(run_dir, resolved), lock)
  except BaseException:
    lock.release()
    raise


def check_same_config(run_dir: pathlib.Path, resolved: Mapping[str, Any]) -> None:
  """Raises UserError, listing the dotted keys, unless `resolved` differs from
  the config.yaml of `run_dir` at most in `rounds` / `checkpoint.*`: what a
  resume (or a complete run left alone) may change."""
  config_path = run_dir / "config.yaml"
  try:
    old = yaml.safe_load(config_path.read_text(encoding="utf-8"))
  except (OSError, yaml.YAMLError):
    raise UserError(f"--resume {run_dir}: not a fedsim run directory"
                    " (no readable config.yaml)") from None
  if not isinstance(old, Mapping):
    raise UserError(f"{config_path}: expected a mapping of config keys")
  differing = [k for k in config_differences(_with_current_defaults(old), resolved)
               if k.split(".")[0] not in MAY_DIFFER]
  if differing:
    raise UserError(f"{run_dir}: the config differs from the checkpointed run in"
                    f" {', '.join(differing)} (only rounds and checkpoint.* may change); leave out"
                    " --resume to start a new run")


def _checkpoint_to_resume(run_dir: pathlib.Path, resolved: Mapping[str, Any]) -> Checkpoint | None:
  _check_text_logs(run_dir)
  check_same_config(run_dir, resolved)
  checkpoint = _intact_checkpoint(run_dir)
  completed = read_status(run_dir)[0] == "completed"
  if checkpoint is None:
    if completed:  # Its checkpoints were deleted: what it logged is all there is.
      raise UserError(f"--resume {run_dir}: a completed run without a checkpoint to extend"
                      " from; leave out --resume to start a new run")
    return None
  rounds = resolved["rounds"]
  if checkpoint.round_num > rounds or (checkpoint.round_num == rounds and completed):
    raise UserError(f"rounds: {run_dir} already ran {checkpoint.round_num} rounds"
                    f" (rounds={rounds}); raise rounds to extend it")
  return checkpoint


def _check_text_logs(run_dir: pathlib.Path) -> None:
  for name in _TEXT_LOGS:
    path = run_dir / name
    try:
      path.read_text(encoding="utf-8")
    except FileNotFoundError:
      continue
    except UnicodeDecodeError as e:
      raise UserError(f"--resume {run_dir}: {path} is damaged (a byte that is not UTF-8 at"
                      f" offset {e.start}); restore or fix the file, or start a new run"
                      " without --resume") from None
    except OSError as e:
      raise UserError(f"--resume {run_dir}: cannot read {path} ({e.strerror or e})") from None


def _intact_checkpoint(run_dir: pathlib.Path) -> Checkpoint | None:
  """The newest intact checkpoint (every file hashed), setting damaged newer
  ones aside with one line on stderr; None if the run has none at all.

  Raises:
    UserError: naming each, if every checkpoint is damaged.
  """
  checkpoint, damaged = intact_checkpoints(run_dir, hash_all=True)
  if damaged and checkpoint is None:
    raise UserError(f"--resume {run_dir}: no intact checkpoint ({'; '.join(damaged)});"
                    " leave out --resume to start a new run")
  for reason in damaged:
    name = reason.split("/", 1)[0]
    aside = run_dir / "checkpoints" / f"damaged_{name}"
    shutil.rmtree(aside, ignore_errors=True)  # set aside by an earlier resume
    os.replace(run_dir / "checkpoints" / name, aside)
  if damaged:
    print(f"fedsim: {run_dir}: checkpoint {'; '.join(damaged)}; resuming from"
          f" round {checkpoint.round_num} (damaged checkpoints moved to damaged_round_*)",
          file=sys.stderr)
  return checkpoint


def choose(logdir: str | os.PathLike, name: str, variant: str | None,
           resolved: Mapping[str, Any], resume: bool | str | os.PathLike | None,
           fresh: bool) -> Resumption | None:
  """The run to continue for one variant, or None to start a new run directory.

  Args:
    logdir, name, variant: where the variant's runs live.
    resolved: the variant's resolved config (as written to config.yaml).
    resume: None or False (a new run directory), True (the newest incomplete
      run with a checkpoint, else the newest incomplete run, restarted; runs
      another process holds are passed over) or a run directory.
    fresh: a new run directory (the default; excludes `resume`).

  Returns:
    None, or a Resumption holding the directory's lock (see `check_resumable`).

  Raises:
    UserError: see `check_resumable`; also when `resume` is True and there is
      nothing to resume, or `resume` and `fresh` are both given.
  """
  if fresh and resume not in (None, False):
    raise UserError("--fresh and --resume exclude each other")
  if resume in (None, False):
    return None
  if resume not in (None, True, False):
    run_dir = pathlib.Path(resume)
    if not run_dir.is_dir():
      raise UserError(f"--resume {run_dir}: no such run directory")
    return check_resumable(run_dir, resolved)
  refused, restart = [], None
  for run_dir in _incomplete_runs(logdir, name, variant):
    try:
      lock = lock_run_dir(run_dir)
    except UserError:  # Live in another process: not ours to take.
      refused.append(str(run_dir))
      continue
    try:
      has_checkpoint = latest_checkpoint(run_dir) is not None
    except BaseException:
      lock.release()
      raise
    if has_checkpoint:
      if restart is not None:
        restart.release()
      return check_resumable(run_dir, resolved, lock)
    if restart is None:
      restart = lock  # The newest run without a checkpoint, if none has one.
    else:
      lock.release()
  if restart is not None:
    return check_resumable(restart.run_dir, resolved, restart)
  label = f"{name}/{variant}" if variant else name
  passed_over = f" (passed over, in use by a live run: {', '.join(refused)})" if refused else ""
  raise UserError(f"--resume: no incomplete run of {label} under {pathlib.Path(logdir) / name}"
                  f" to resume{passed_over}")
