"""A run's hyperparameters and final metrics for TensorBoard's HParams tab.

Each run directory becomes one HParams session; pointing TensorBoard at
`<logdir>/<name>` then shows every variant of the experiment as one row of a
table, with the hyperparameters and the final metrics as columns. No
experiment-level config is written: the plugin infers the columns from the
sessions, so runs never need to agree on a shared file.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Mapping

FINAL_PREFIX = "final/"

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


def write_hparams(run_dir: str | os.PathLike, hparams: Mapping[str, HParamValue],
                  final_metrics: Mapping[str, float], step: int = 0) -> None:
  """Records `hparams` and `final_metrics` as an HParams session in `run_dir`.

  Final metrics are scalars tagged 'final/<name>' at `step` (the last round),
  so they do not add points to the per-round curves of the same name.
  Imports TensorFlow (~10 s the first time in a process).

  Raises:
    TypeError: if a hyperparameter value is not a bool, int, float or str.
    OSError: naming `run_dir`, if the events cannot be written.
  """
  from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top

  from fedsim.reporting.sinks import load_tensorflow, os_error_from_tf  # pylint: disable=g-import-not-at-top

  for key, value in hparams.items():
    if not isinstance(value, (bool, int, float, str)):
      raise TypeError(f"hparam '{key}' must be a bool, int, float or str,"
                      f" got {type(value).__name__}")
  tf = load_tensorflow()
  run_dir = pathlib.Path(run_dir)
  try:
    writer = tf.summary.create_file_writer(os.fspath(run_dir))
    try:
      with writer.as_default(step=int(step)):
        hp.hparams(dict(hparams), trial_id=run_dir.name)
        for name, value in final_metrics.items():
          tf.summary.scalar(FINAL_PREFIX + name, float(value))
    finally:
      writer.close()
  except tf.errors.OpError as e:
    raise os_error_from_tf(e, run_dir) from None
