"""A run's hyperparameters and final metrics for TensorBoard's HParams tab.

Each run directory becomes one HParams session; pointing TensorBoard at
`<logdir>/<name>` then shows every variant of the experiment as one row of a
table. Left to itself the plugin makes a column of every config key (50 and
more, in no useful order) and a metric of every scalar of every sub-directory
(`eval/accuracy` once per run directory, again under `simulated_time/`, ...).
So each finished run also rewrites the experiment's one HParams config,
`<logdir>/<name>/events.out.tfevents.*.fedsim-hparams`, from the
`config.yaml` of every run directory there: the keys whose values differ
between runs first, then the rest, and the final metrics once each.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Mapping, Sequence

import yaml

FINAL_PREFIX = "final/"
EXPERIMENT_SUFFIX = ".fedsim-hparams"  # the experiment config's event file name ends so

HParamValue = float | int | str | bool


def flat_hparams(plain_config: Mapping[str, Any], prefix: str = "") -> dict[str, HParamValue]:
  """Returns the leaves of a nested config as {'dotted.key': value}.

  Lists and None become their string form, since an HParams value must be a
  number, a string or a bool.
  """
  out: dict[str, HParamValue] = {}
  for key, value in plain_config.items():
    name = f"{prefix}{key}"
    if isinstance(value, Mapping):
      out.update(flat_hparams(value, prefix=f"{name}."))
    elif isinstance(value, (bool, int, float, str)):
      out[name] = value
    else:
      out[name] = str(value)
  return out


def varying_first(runs: Sequence[Mapping[str, HParamValue]]) -> list[str]:
  """Every key of `runs` (flat hparams of each run), those that differ first.

  A key differs if two runs have different values for it or some run lacks
  it. Within each group keys keep the order in which they first appear.
  """
  keys = list(dict.fromkeys(k for run in runs for k in run))
  missing = object()

  def differs(key: str) -> bool:
    return len({repr(run.get(key, missing)) for run in runs}) > 1

  return [k for k in keys if differs(k)] + [k for k in keys if not differs(k)]


def _sibling_hparams(experiment_dir: pathlib.Path) -> list[dict[str, HParamValue]]:
  """Flat hparams of each run directory's config.yaml under `experiment_dir`."""
  runs = []
  for config in sorted(experiment_dir.glob("*/config.yaml")):
    try:
      data = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
      continue  # Not ours to judge here; `fedsim compare` names broken runs.
    if isinstance(data, Mapping):
      data = {k: v for k, v in data.items() if k != "variants"}
      runs.append(flat_hparams(data))
  return runs


def write_hparams(run_dir: str | os.PathLike, hparams: Mapping[str, HParamValue],
                  final_metrics: Mapping[str, float], step: int = 0) -> None:
  """Records `hparams` and `final_metrics` as an HParams session in `run_dir`.

  Final metrics are scalars tagged 'final/<name>' at `step` (the last round),
  so they do not add points to the per-round curves of the same name. Then
  rewrites the experiment config in `run_dir`'s parent (see the module
  docstring). Imports TensorFlow (~10 s the first time in a process).

  Raises:
    TypeError: if a hyperparameter value is not a bool, int, float or str.
    OSError: naming the directory, if the events cannot be written.
  """
  from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top

  from fedsim.reporting.sinks import load_tensorflow  # pylint: disable=g-import-not-at-top

  for key, value in hparams.items():
    if not isinstance(value, (bool, int, float, str)):
      raise TypeError(f"hparam '{key}' must be a bool, int, float or str,"
                      f" got {type(value).__name__}")
  tf = load_tensorflow()
  run_dir = pathlib.Path(run_dir)
  _write_events(tf, run_dir, step, lambda: [
      hp.hparams(dict(hparams), trial_id=run_dir.name),
      *(tf.summary.scalar(FINAL_PREFIX + name, float(value))
        for name, value in final_metrics.items())])
  experiment_dir = run_dir.parent
  runs = _sibling_hparams(experiment_dir) or [dict(hparams)]
  columns = [hp.HParam(key) for key in varying_first(runs)]
  metrics = [hp.Metric(FINAL_PREFIX + name) for name in dict.fromkeys(final_metrics)]
  old = sorted(experiment_dir.glob(f"events.out.tfevents.*{EXPERIMENT_SUFFIX}"))
  _write_events(tf, experiment_dir, 0,
                lambda: hp.hparams_config(hparams=columns, metrics=metrics),
                filename_suffix=EXPERIMENT_SUFFIX)
  for path in old:  # One config per experiment: the plugin would pick any of several.
    path.unlink(missing_ok=True)


def _write_events(tf, log_dir: pathlib.Path, step: int, write, filename_suffix: str = "") -> None:
  """Calls `write()` under a new summary writer of `log_dir`; closes it.

  Raises:
    OSError: naming `log_dir`, if the events cannot be written.
  """
  from fedsim.reporting.sinks import os_error_from_tf  # pylint: disable=g-import-not-at-top
  try:
    writer = tf.summary.create_file_writer(os.fspath(log_dir),
                                           filename_suffix=filename_suffix)
    try:
      with writer.as_default(step=int(step)):
        write()
    finally:
      writer.close()
  except tf.errors.OpError as e:
    raise os_error_from_tf(e, log_dir) from None
