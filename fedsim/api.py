"""fedsim's Python API: the same validation and run loop as the CLI.

Which run directory each variant runs in (a new one, or an interrupted run
to resume) is decided for all variants before anything is built, so a config
that cannot resume is refused before the first variant spends any time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import sys
import pathlib
import types
from typing import Any, Callable, Mapping, Sequence

from fedsim.experiment.config.loader import expand_variants, plain
from fedsim.experiment.config.variant_overrides import load_for_variant
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
  raw = load_for_variant(config, overrides, variant)
  runs = expand_variants(raw, only=variant)
  notes = check_environment(runs)
  return Validated([name or _config_name(raw) for name, _ in runs], notes)


def _config_name(raw) -> str:
  return str(raw.get("name", ""))


def run(config: ConfigSource, overrides: Sequence[str] = (), logdir: str | os.PathLike = "runs",
        progress: bool | None = None, on_run_dir: Callable[[pathlib.Path], None] | None = None,
        *, resume: bool | str | os.PathLike | None = None, fresh: bool = False,
        on_round: Callable[..., None] | None = None,
        variant: str | None = None, data: Any = None, model: Any = None,
        callbacks: Sequence[Any] = ()):
  """Runs an experiment, each variant in a new run directory unless told to resume.

  Args:
    config: a YAML path or a config mapping.
    overrides: `dotted.key=value` strings, as the CLI's `--set` (with
      `variant`, applied to that variant: see `variant_overrides`).
    logdir: root of the run directories (`<logdir>/<name>/<run>/`).
    progress: progress bar on/off; None = only when stdout is a terminal.
    on_run_dir: called with each run directory as soon as it exists.
    resume: None (default): new run directories; True: each variant resumes
      its newest incomplete run that has a checkpoint, else restarts its
      newest incomplete run from round 0 (an error if a variant has none;
      runs live in another process are passed over); a run directory: resume
      that one (for a config with variants, the variant whose runs it belongs
      to), or restart it if it stopped before its first checkpoint.
    fresh: new run directories: the default, kept for old callers (it
      excludes `resume`).
    on_round: called after each round as `on_round(round, metrics, info)`,
      `info` a `fedsim.RoundInfo` (trainable weights as NumPy arrays, the
      sampled and aggregated client ids); a callback taking two arguments is
      called as `on_round(round, metrics)`.
    variant: run only this variant of the config (UserError listing the
      variants if it has none of that name).
    data: replaces the config's dataset: a `fedsim.data.FederatedData`, a
      dict as a `custom` builder returns, a function `fn(seed=...)` returning
      either, or an import path 'module:function'. The data section's batching
      and partitioning keys still apply.
    model: replaces the config's model: a function `(input_shape,
      num_classes) -> tf.keras.Model` or an import path 'module:function'
      (the `keras` model entry); `model.initial_weights` still applies.
    callbacks: `fedsim.Callback` objects called after fedsim's own (after
      each round is logged and its checkpoint on disk, after `on_round`), in order,
      for every run of the config in turn; one's `after_round` returning
      True ends the run after that round (see `fedsim.Callback`).

  Returns:
    a `RunResult` (run_dir, metrics per round, size_info, final weights) for
    a config without variants; otherwise a dict variant name -> RunResult
    (one entry with `variant`).

  Raises:
    UserError: bad input, a run to resume whose config differs in other
      keys than `rounds`, or one that another process is running (nothing is
      run, nothing written); a callback that is not a `fedsim.Callback`.
      RunFailed: a run could not finish (a callback that raised is named).
  """
  from fedsim.experiment import resume as resuming
  raw = load_for_variant(config, overrides, variant)
  raw = _with_objects(raw, data, model)
  runs = expand_variants(raw, only=variant)  # validates them all before TF is imported
  on_round = _three_argument(on_round)
  callbacks = _callbacks(callbacks)
  # Each run directory is locked (see fedsim.reporting.ownership) before
  # anything in it is read for resuming or changed, until its run ends.
  with contextlib.ExitStack() as held:
    plans = []
    for variant, cfg in runs:
      resolved = plain(cfg)
      resolved.pop("variants", None)
      target = resume
      if (resume not in (None, True, False) and variant is not None
          and not resuming.belongs(pathlib.Path(resume).resolve().name, variant)):
        target = None  # The named directory belongs to another variant.
      resumption = resuming.choose(logdir, cfg.name, variant, resolved, target, fresh)
      if resumption is not None:
        held.callback(resumption.lock.release)
      plans.append((variant, cfg, resolved, resumption))
    if resume not in (None, True, False) and not any(p[3] for p in plans):
      raise UserError(f"--resume {resume}: not a run of any variant of this config")
    results = _run_plans(plans, logdir, held, progress, on_run_dir, on_round, callbacks)
  if len(runs) == 1 and runs[0][0] is None:
    return results[None]
  return results


def _run_plans(plans, logdir, held: contextlib.ExitStack, progress, on_run_dir, on_round,
               callbacks):
  """Runs each (variant, cfg, resolved, resumption) of `run`; {variant: RunResult}."""
  from fedsim.backend import quiet
  quiet.import_tff()  # before any module below imports TF/TFF noisily
  from fedsim.runtime.runtime_registry import runtime_of
  first = plans[0][1].runtime  # before TF runs an op; the first run's choice
  runtime_of(first.name).configure(first.params)
  from fedsim.experiment.loop import run_rounds
  from fedsim.state.rewind import rewind_to_start
  from fedsim.experiment.simulation import build_simulation
  from fedsim.reporting import create_run_dir, mark_failed, mark_interrupted, write_config
  from fedsim.reporting.ownership import lock_run_dir
  from fedsim.runtime import signals
  from fedsim.runtime.session import session

  results = {}
  for variant, cfg, resolved, resumption in plans:
    try:
      with quiet.filtered_stderr():  # TFF's compiler logs known noise while building
        sim = build_simulation(cfg)
    except UserError as e:
      # A run the study planned (or one resumed) says why, not 'not started'. It
      # stays resumable: what a build refuses may be the machine's to mend (a
      # data file, a GPU), not the config's.
      if resumption is not None:
        mark_failed(resumption.run_dir, e)
      raise
    if sim.runtime_notice:
      print(f"fedsim: {sim.runtime_notice}", file=sys.stderr)
    if resumption is None:
      run_dir, checkpoint = create_run_dir(logdir, cfg.name, variant), None
      lock = lock_run_dir(run_dir)  # New and empty: only a --resume could race for it.
      held.callback(lock.release)
    else:
      run_dir, checkpoint, lock = resumption.run_dir, resumption.checkpoint, resumption.lock
      if checkpoint is None and not (run_dir / "status").is_file():
        print(f"starting {run_dir}: {cfg.rounds} rounds", flush=True)  # planned by a study
        rewind_to_start(run_dir)
      elif checkpoint is None:
        print(f"restarting {run_dir} from round 0 of {cfg.rounds}: it stopped before its"
              " first checkpoint", flush=True)
        rewind_to_start(run_dir)
      else:
        print(f"resuming {run_dir} after round {checkpoint.round_num} of {cfg.rounds}",
              flush=True)
    if on_run_dir:
      on_run_dir(run_dir)
    # A signal before the loop writes its status (here, while the worker or
    # the first round starts) would leave the run without one, and a forced
    # exit (see fedsim.runtime.signals) skips the loop's own: both read
    # `interrupted` (a status the loop wrote stays).
    with signals.forced_exit_hook(lambda d=run_dir: mark_interrupted(d)):
      try:
        write_config(run_dir, resolved)
        # What the runtime holds (ray's actors and private instance) ends with the run.
        with session(str(run_dir / "worker.log"),
                     cfg.runtime.params.max_concurrent_computation_calls) as runtime, \
            contextlib.closing(sim.round_process):
          results[variant] = run_rounds(sim, run_dir, resolved, progress=progress,
                                        check_runtime=runtime.check_alive,
                                        resume_from=checkpoint, on_round=on_round,
                                        user_callbacks=callbacks)
      except (KeyboardInterrupt, SystemExit):
        with contextlib.suppress(OSError, UserError):  # the signal is what to report
          mark_interrupted(run_dir)
        raise
      except Exception as e:
        mark_failed(run_dir, e)
        raise
    lock.release()  # The worker, which logs into the directory, has stopped.
  return results


def _callbacks(callbacks: Sequence[Any]) -> list:
  """`callbacks` as a list, each checked to be a `fedsim.Callback` (UserError)."""
  from fedsim.experiment.callbacks import Callback
  if isinstance(callbacks, Callback):
    callbacks = [callbacks]
  out = list(callbacks)
  for i, callback in enumerate(out):
    if not isinstance(callback, Callback):
      raise UserError(f"callbacks[{i}]: expected a fedsim.Callback (subclass it), got"
                      f" {type(callback).__name__}")
  return out


def _three_argument(on_round: Callable[..., None] | None) -> Callable[..., None] | None:
  """`on_round` as the loop calls it, (round, metrics, info); two-argument
  callbacks, (round, metrics), get the first two."""
  if on_round is None:
    return None
  if not callable(on_round):  # else the first round trained, then the run failed on it
    raise UserError(f"on_round: expected a function of (round, metrics[, info]), got"
                    f" {type(on_round).__name__} {on_round!r:.40}")
  try:
    inspect.signature(on_round).bind(0, {}, None)
  except TypeError:
    return lambda round_num, metrics, info: on_round(round_num, metrics)
  except ValueError:  # No signature to inspect (a builtin): assume the current form.
    pass
  return on_round


# Objects passed as `run(data=..., model=...)`, reachable by the import path that
# config.yaml records for them ('fedsim.api:passed.data_0'), as a config's
# `builder:` keys are. The same object gets the same name, so a run made with
# it can be resumed in the same process.
passed = types.SimpleNamespace()
_passed_names: dict[tuple[str, int], str] = {}


def _pass(kind: str, obj: Any, builder: Callable[..., Any]) -> str:
  """The import path of `builder`, kept in `passed` for as long as the process runs."""
  key = (kind, id(obj))
  if key not in _passed_names:
    _passed_names[key] = f"{kind}_{len(_passed_names)}"
    setattr(passed, _passed_names[key], builder)  # Keeps `obj` alive: ids stay unique.
  return f"{__name__}:passed.{_passed_names[key]}"


def _with_objects(raw: Mapping[str, Any], data: Any, model: Any) -> Mapping[str, Any]:
  """`raw` with its data / model section replaced by the objects passed to `run`."""
  if data is None and model is None:
    return raw
  from fedsim.data.federated import ClientBatching, FederatedData, Partitioning
  out = dict(raw)
  if data is not None:
    old = raw.get("data") if isinstance(raw.get("data"), Mapping) else {}
    kept = {f.name for cls in (ClientBatching, Partitioning)
            for f in dataclasses.fields(cls)} | {"num_classes"}
    if isinstance(data, str):
      builder = data
    elif callable(data) and not isinstance(data, FederatedData):
      builder = _pass("data", data, data)
    else:
      builder = _pass("data", data, lambda seed, **args: data)
    out["data"] = {"name": "custom", "builder": builder,
                   **{k: v for k, v in old.items() if k in kept}}
  if model is not None:
    old = raw.get("model") if isinstance(raw.get("model"), Mapping) else {}
    if isinstance(model, str):
      builder = model
    elif callable(model):
      builder = _pass("model", model, lambda input_shape, num_classes, **args:
                      model(input_shape, num_classes, **args))
    else:
      raise UserError(f"model=: expected a function (input_shape, num_classes) ->"
                      f" tf.keras.Model or an import path 'module:function', got"
                      f" {type(model).__name__}")
    out["model"] = {"name": "keras", "builder": builder,
                    **{k: v for k, v in old.items() if k == "initial_weights"}}
  return out

