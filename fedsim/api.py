"""fedsim's Python API: the same validation and run loop as the CLI."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Callable, Mapping, Sequence

from fedsim.config.loader import expand_variants, load_config, plain

ConfigSource = str | os.PathLike | Mapping[str, Any]


def validate(config: ConfigSource, overrides: Sequence[str] = ()) -> list[str]:
  """Checks a config (and all its variants) without running it.

  Returns the names of the runs it would make. Raises UserError on bad input.
  """
  _, raw = load_config(config, overrides)
  return [variant or _config_name(raw) for variant, _ in expand_variants(raw)]


def _config_name(raw) -> str:
  return str(raw.get("name", ""))


def run(config: ConfigSource, overrides: Sequence[str] = (), logdir: str | os.PathLike = "runs",
        progress: bool | None = None, on_run_dir: Callable[[pathlib.Path], None] | None = None):
  """Runs an experiment.

  Args:
    config: a YAML path or a config mapping.
    overrides: `dotted.key=value` strings, as the CLI's `--set`.
    logdir: root of the run directories (`<logdir>/<name>/<run>/`).
    progress: progress bar on/off; None = only when stdout is a terminal.
    on_run_dir: called with each run directory as soon as it exists.

  Returns:
    a `RunResult` (run_dir, metrics per round, size_info, final weights) for
    a config without variants; otherwise a dict variant name -> RunResult.

  Raises:
    UserError: bad input (nothing is run). RunFailed: a run could not finish.
  """
  _, raw = load_config(config, overrides)
  runs = expand_variants(raw)  # validates every variant before TF is imported

  from fedsim.runtime import quiet
  quiet.import_tff()  # before any module below imports TF/TFF noisily
  from fedsim.experiment.loop import run_rounds
  from fedsim.experiment.simulation import build_simulation
  from fedsim.reporting import create_run_dir, write_config
  from fedsim.runtime import worker

  results = {}
  for variant, cfg in runs:
    with quiet.filtered_stderr():  # TFF's compiler logs known noise while building
      sim = build_simulation(cfg)
    run_dir = create_run_dir(logdir, cfg.name, variant)
    if on_run_dir:
      on_run_dir(run_dir)
    resolved = plain(cfg)
    resolved.pop("variants", None)
    write_config(run_dir, resolved)
    with worker.session(str(run_dir / "worker.log"),
                        cfg.runtime.max_concurrent_computation_calls) as runtime:
      results[variant] = run_rounds(sim, run_dir, resolved, progress=progress,
                                    check_runtime=runtime.check_alive)
  if len(runs) == 1 and runs[0][0] is None:
    return results[None]
  return results
