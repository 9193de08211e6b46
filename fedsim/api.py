"""fedsim's Python API: the same validation and run loop as the CLI.

Which run directory each variant runs in (a new one, or an interrupted run
to resume) is decided for all variants before anything is built, so a config
that cannot resume is refused before the first variant spends any time.
"""

from __future__ import annotations

import os
import sys
import pathlib
from typing import Any, Callable, Mapping, Sequence

from fedsim.experiment.config.loader import expand_variants, load_config, plain
from fedsim.errors import UserError

ConfigSource = str | os.PathLike | Mapping[str, Any]


class Validated(list):
  """The names of the runs a config makes (a list), and what could not be checked.

  Attributes:
    not_checked: one line per thing validation cannot check without
      TensorFlow or a run, e.g. 'not checked: the contents of <file> ...'.
  """

  def __init__(self, names: Sequence[str], not_checked: Sequence[str] = ()):
    super().__init__(names)
    self.not_checked = list(not_checked)


def validate(config: ConfigSource, overrides: Sequence[str] = (), *,
             variant: str | None = None) -> Validated:
  """Checks a config (and all its variants, or only `variant`) without running it.

  Besides the config's keys, checks this machine without importing
  TensorFlow: dataset files exist, `builder:` modules import, a GPU is there
  for `runtime.device: gpu` (see fedsim/config/environment.py).

  Returns:
    The names of the runs it would make, with `.not_checked` notes.

  Raises:
    UserError: on bad input, naming the key.
  """
  from fedsim.experiment.config.environment import check_environment
  _, raw = load_config(config, overrides)
  runs = expand_variants(raw, only=variant)
  notes = check_environment(runs)
  return Validated([name or _config_name(raw) for name, _ in runs], notes)


def _config_name(raw) -> str:
  return str(raw.get("name", ""))


def run(config: ConfigSource, overrides: Sequence[str] = (), logdir: str | os.PathLike = "runs",
        progress: bool | None = None, on_run_dir: Callable[[pathlib.Path], None] | None = None,
        *, resume: bool | str | os.PathLike | None = None, fresh: bool = False,
        on_round: Callable[[int, dict[str, float]], None] | None = None,
        variant: str | None = None):
  """Runs an experiment, resuming interrupted runs from their checkpoints.

  Args:
    config: a YAML path or a config mapping.
    overrides: `dotted.key=value` strings, as the CLI's `--set`.
    logdir: root of the run directories (`<logdir>/<name>/<run>/`).
    progress: progress bar on/off; None = only when stdout is a terminal.
    on_run_dir: called with each run directory as soon as it exists.
    resume: None: each variant resumes its newest incomplete run that has a
      checkpoint, else starts a new run; True: the same, but a variant with
      nothing to resume is an error; a run directory: resume that one (for a
      config with variants, the variant whose runs it belongs to).
    fresh: start new run directories, whatever exists (nothing is deleted).
    on_round: called as `on_round(round, metrics)` after each round.
    variant: run only this variant of the config (UserError listing the
      variants if it has none of that name).

  Returns:
    a `RunResult` (run_dir, metrics per round, size_info, final weights) for
    a config without variants; otherwise a dict variant name -> RunResult
    (one entry with `variant`).

  Raises:
    UserError: bad input, or a run to resume whose config differs in other
      keys than `rounds` (nothing is run). RunFailed: a run could not finish.
  """
  from fedsim.experiment import resume as resuming
  _, raw = load_config(config, overrides)
  runs = expand_variants(raw, only=variant)  # validates them all before TF is imported
  plans = []
  for variant, cfg in runs:
    resolved = plain(cfg)
    resolved.pop("variants", None)
    target = resume
    if (resume not in (None, True, False) and variant is not None
        and not resuming.belongs(pathlib.Path(resume).resolve().name, variant)):
      target = None  # The named directory belongs to another variant.
    plans.append((variant, cfg, resolved,
                  resuming.choose(logdir, cfg.name, variant, resolved, target, fresh)))
  if resume not in (None, True, False) and not any(p[3] for p in plans):
    raise UserError(f"--resume {resume}: not a run of any variant of this config")

  from fedsim.backend import quiet
  quiet.import_tff()  # before any module below imports TF/TFF noisily
  from fedsim.experiment.loop import run_rounds
  from fedsim.experiment.simulation import build_simulation
  from fedsim.reporting import create_run_dir, mark_interrupted, write_config
  from fedsim.runtime import signals
  from fedsim.runtime.session import session

  results = {}
  for variant, cfg, resolved, resumption in plans:
    with quiet.filtered_stderr():  # TFF's compiler logs known noise while building
      sim = build_simulation(cfg)
    if sim.runtime_notice:
      print(f"fedsim: {sim.runtime_notice}", file=sys.stderr)
    if resumption is None:
      run_dir, checkpoint = create_run_dir(logdir, cfg.name, variant), None
    else:
      run_dir, checkpoint = resumption.run_dir, resumption.checkpoint
      print(f"resuming {run_dir} after round {checkpoint.round_num} of {cfg.rounds}",
            flush=True)
    if on_run_dir:
      on_run_dir(run_dir)
    write_config(run_dir, resolved)
    # A forced exit (see fedsim.runtime.signals) skips the loop's own status.
    with session(str(run_dir / "worker.log"),
                 cfg.runtime.max_concurrent_computation_calls) as runtime, \
        signals.forced_exit_hook(lambda d=run_dir: mark_interrupted(d)):
      results[variant] = run_rounds(sim, run_dir, resolved, progress=progress,
                                    check_runtime=runtime.check_alive,
                                    resume_from=checkpoint, on_round=on_round)
  if len(runs) == 1 and runs[0][0] is None:
    return results[None]
  return results

