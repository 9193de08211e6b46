"""The experiment's runs and the metrics they are ranked by, for TensorBoard's
HParams tab.

Each completed run directory is one HParams session (one row of the table,
named after the run). Left to itself the plugin makes a column of every
config key (50 and more, in no useful order), leaves a column blank in the
runs that lack the key (the uncompressed baseline then has no encoder and
drops out of the parallel-coordinates view) and a metric of every scalar.
So whenever a run completes, `write_sessions` rewrites the session of every
completed run of the experiment from their `config.yaml` and `metrics.csv`:
the same columns in all, a key a run lacks filled with `identity` (an
encoder) or `none`; and the experiment's HParams config, listing those
columns and the ranking metrics (`RANKING`), once, in the comparison run.

The dashboard shows 5 columns until the user ticks more: the first 5 of the
config's list once those whose `differs` is set are moved ahead (TensorBoard
2.14's hparams dashboard, `_computeHParams`). So the keys that differ
between runs come first and are marked so, and among them a key whose value
follows from the keys before it (`aggregation.bits` equal to `broadcast.bits`
in every run, a `min_elements` that only the baseline lacks) goes after those
that do not, and among those, one that only the baseline lacks goes last
(`informative_first`): the defaults are the study's own knobs.

Bits and time to a target: the target is the eval accuracy last given to
`fedsim compare --target` for the experiment (kept in the comparison run,
`board.TARGET_FILE`), else 90% of the best eval accuracy any completed run
reached (`TARGET_FRACTION`), so it exists for every experiment; a run that
never reaches it has no value there. The metric's description says which.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from typing import Any, Callable, Mapping, Sequence

FINAL_PREFIX = "final/"
SESSION_SUFFIX = ".fedsim-session"  # a run's session event file name ends so
TARGET_FRACTION = 0.9
# The ranking metrics: tag (under final/) -> the column's title.
RANKING = {
    "eval/accuracy": "final accuracy",
    "total_bits": "total bits (both ways)",
    "bits_to_target": "bits to target",
    "simulated_seconds_to_target": "simulated s to target",
    "simulated_seconds": "simulated s",
    "eval/loss": "final eval loss",
}

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


def informative_first(runs: Sequence[Mapping[str, HParamValue]]) -> list[tuple[str, bool]]:
  """Every key of `runs` (flat hparams of each run) with whether it differs
  between them: (key, True) for those that do, informative ones first.

  A key differs if two runs have different values for it or some run lacks
  it. It is informative unless the values of the informative keys before it
  determine its value in every run. The informative keys keep the order in
  which they first appear; the other differing ones follow, those with more
  distinct values first; then the keys that do not differ.
  """
  keys = list(dict.fromkeys(k for run in runs for k in run))
  missing = object()
  values = {k: [repr(run.get(k, missing)) for run in runs] for k in keys}
  differing = [k for k in keys if len(set(values[k])) > 1]
  informative: list[str] = []
  for key in differing:
    seen: dict[tuple, str] = {}
    for i, value in enumerate(values[key]):
      if seen.setdefault(tuple(values[k][i] for k in informative), value) != value:
        informative.append(key)
        break
  # Of the others, those with more distinct values first: a key only the
  # baseline lacks (2 values) says less than one it shares with the knobs.
  others = sorted((k for k in differing if k not in informative),
                  key=lambda k: -len(set(values[k])))
  return ([(k, True) for k in informative] + [(k, True) for k in others]
          + [(k, False) for k in keys if k not in differing])


def filled(runs: Sequence[Mapping[str, HParamValue]]) -> list[dict[str, HParamValue]]:
  """`runs` (flat hparams) with the same columns, in `informative_first` order.

  A key that is a section in another run (`compression: null` in the
  baseline, `compression.aggregation.encoder` in a variant) is left out; a
  key a run lacks becomes 'identity' if it names an encoder, else 'none'.
  """
  keys = list(dict.fromkeys(k for run in runs for k in run))
  sections = {k for k in keys if any(other.startswith(k + ".") for other in keys)}
  rows = [{k: run.get(k, "identity" if k.rsplit(".", 1)[-1] == "encoder" else "none")
           for k in keys if k not in sections} for run in runs]
  order = [key for key, _ in informative_first(rows)]
  return [{k: row[k] for k in order} for row in rows]


def default_target(runs: Sequence[Any]) -> float | None:
  """`TARGET_FRACTION` of the best eval accuracy of `runs`; None if none evaluated."""
  from fedsim.metric_names import EVAL_ACCURACY
  best = max((row[EVAL_ACCURACY] for run in runs for row in run.metrics
              if EVAL_ACCURACY in row), default=None)
  return None if best is None else TARGET_FRACTION * best


def ranking_metrics(runs: Sequence[Any], target: float | None) -> list[dict[str, float]]:
  """The `RANKING` values of each of `runs` (`run_records.Run`), the 'to
  target' ones at eval accuracy `target` (none if None); a metric a run has
  no value for (no evaluation, target never reached) is absent."""
  from fedsim.metric_names import EVAL_ACCURACY, EVAL_LOSS, SIMULATED_SECONDS, bits_sent
  out = []
  for run in runs:
    values: dict[str, float] = {}
    evaluated = [row for row in run.metrics if EVAL_ACCURACY in row]
    if evaluated:
      values["eval/accuracy"] = evaluated[-1][EVAL_ACCURACY]
      if EVAL_LOSS in evaluated[-1]:
        values["eval/loss"] = evaluated[-1][EVAL_LOSS]
    if run.metrics:
      values["total_bits"] = bits_sent(run.metrics[-1])
      if SIMULATED_SECONDS in run.metrics[-1]:
        values["simulated_seconds"] = run.metrics[-1][SIMULATED_SECONDS]
    reached = run.to_target(target) if target is not None else None
    if reached:
      values["bits_to_target"] = reached["bits"]
      if reached["seconds"] is not None:
        values["simulated_seconds_to_target"] = reached["seconds"]
    out.append(values)
  return out


def write_sessions(runs: Sequence[Any], target: float | None = None) -> Callable[[], Any]:
  """Rewrites the HParams session of each of `runs` (completed `run_records.Run`s
  of one experiment).

  Each session (its hparams, and the ranking metrics as 'final/<tag>'
  scalars at step = the run's last round) is a new event file in the run
  directory that replaces the previous one. `target` is the eval accuracy
  of the 'to target' metrics (None: `default_target`). Imports TensorFlow.

  Returns:
    A function writing the experiment's HParams config (its columns and
    metrics) to the default summary writer; the caller puts it in the
    comparison run.

  Raises:
    OSError: naming the directory, if the events cannot be written.
  """
  # pylint: disable-next=g-import-not-at-top
  from tensorboard.plugins.hparams import api as hp, api_pb2, summary as hp_summary

  from fedsim.reporting.sinks import load_tensorflow  # pylint: disable=g-import-not-at-top
  tf = load_tensorflow()
  configs = [flat_hparams({k: v for k, v in run.config.items() if k != "variants"})
             for run in runs]
  rows = filled(configs)
  given = target is not None
  target = target if given else default_target(runs)
  ranked = ranking_metrics(runs, target)
  for run, hparams, metrics in zip(runs, rows, ranked):
    old = sorted(run.path.glob(f"events.out.tfevents.*{SESSION_SUFFIX}"))
    step = run.metrics[-1].get("round", 0) if run.metrics else 0
    # The file is named by what it holds: a session already on disk as it
    # would be written is kept (a study's board is refreshed after each run,
    # and most sessions do not change).
    suffix = f".{_digest((run.name, step, sorted(hparams.items()), sorted(metrics.items())))}"
    if len(old) == 1 and old[0].name.endswith(suffix + SESSION_SUFFIX):
      continue
    write_events(tf, run.path, step, lambda h=hparams, m=metrics, r=run: [
        hp.hparams(h, trial_id=r.name),
        *(tf.summary.scalar(FINAL_PREFIX + tag, float(value)) for tag, value in m.items())],
                 suffix + SESSION_SUFFIX)
    unlink_all(old)  # One session per run: the plugin would pick any of several.
  differs = dict(informative_first(rows))
  columns = [api_pb2.HParamInfo(name=key, differs=differs[key]) for key in (rows[0] if rows else {})]
  if target is None:
    to_target = "no run evaluated: no target"
  elif given:
    to_target = f"target: eval accuracy {target:.4f}, as given to `fedsim compare --target`"
  else:
    to_target = (f"target: eval accuracy {target:.4f} ({TARGET_FRACTION:.0%} of the best run's;"
                 " `fedsim compare --target` sets it)")
  metrics = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=FINAL_PREFIX + tag),
                                display_name=title,
                                description=to_target if "target" in tag else "")
             for tag, title in RANKING.items()]
  config = hp_summary.experiment_pb(columns, metrics, time_created_secs=0.0).SerializeToString()
  return lambda: tf.summary.experimental.write_raw_pb(config, step=0)


def _digest(content: Any) -> str:
  """12 hex digits naming `content` (plain values: its repr is its identity)."""
  return hashlib.sha256(repr(content).encode()).hexdigest()[:12]


def write_events(tf, log_dir: pathlib.Path, step: int, write, filename_suffix: str) -> None:
  """Calls `write()` under a new summary writer of `log_dir` (a new event
  file whose name ends with `filename_suffix`); closes it.

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


def unlink_all(paths: Sequence[pathlib.Path]) -> None:
  for path in paths:
    path.unlink(missing_ok=True)
