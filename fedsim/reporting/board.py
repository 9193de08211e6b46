"""The experiment directory as TensorBoard shows it (`tensorboard --logdir
<logdir>/<name>`): one run per run directory, plus one run, `comparison/`,
holding what belongs to the experiment rather than to a run:

* the custom-scalars layout (Custom Scalars tab, `layout_proto`): accuracy by
  round, by cumulative bits and by simulated time first, each chart with
  every run. Every chart is a margin chart with no margin: TensorBoard
  smooths line charts (weight 0.6 by default, which bends a curve of a few
  evaluations toward its first points) and draws margin charts as logged.
  The chart by simulated time is there only when a run models devices or
  links (`models_clock`): without, simulated time is each client's examples
  times `seconds_per_example`, and the chart says nothing the chart by round
  does not;
* the HParams config (columns and ranking metrics, see `hparams`);
* `fedsim compare`'s accuracy-versus-bits figure (log bits axis) as an image
  (Images tab).

`refresh` rewrites all of it, and every completed run's HParams session,
whenever a run completes and when `fedsim compare --target` gives a target:
the comparison run's event file is replaced, so TensorBoard shows the newest
figure and layout only.
"""

from __future__ import annotations

import pathlib
from typing import Any, Mapping

import numpy as np

from fedsim.errors import UserError
from fedsim.metric_names import (CUMULATIVE_AGGREGATE_BITS, CUMULATIVE_BROADCAST_BITS,
                                 EVAL_ACCURACY, EVAL_ACCURACY_BY_BITS,
                                 EVAL_ACCURACY_BY_SIMULATED_MS, EVAL_LOSS, TRAIN_LOSS)
from fedsim.reporting import hparams
from fedsim.reporting.board_tags import board_tag
from fedsim.reporting.compare_plot import draw_accuracy
from fedsim.reporting.run_records import load_runs
from fedsim.reporting.rundir import COMPARISON_RUN, write_text_atomic

BOARD_SUFFIX = ".fedsim-board"
FIGURE_TAG = "comparison/accuracy_vs_bits"
# In the comparison run: the eval accuracy `fedsim compare --target` last gave.
TARGET_FILE = "hparams_target.txt"
# Where fedsim versions before the comparison run wrote the HParams config
# (TensorBoard showed it as a run named '.').
_OLD_CONFIG_SUFFIX = ".fedsim-hparams"
BY_SIMULATED_TIME = "eval accuracy by simulated milliseconds"

# (category, [(chart title, tag)]) in the order shown: each chart draws its tag of
# every run. One tag a chart: a margin chart with several lists, under "Missing
# Tags", the runs without any (the comparison run).
LAYOUT = (
    ("accuracy, every run", [
        ("eval accuracy by round", EVAL_ACCURACY),
        ("eval accuracy by cumulative bits sent (broadcast + aggregate)", EVAL_ACCURACY_BY_BITS),
        (BY_SIMULATED_TIME, EVAL_ACCURACY_BY_SIMULATED_MS),
    ]),
    ("loss by round, every run", [
        ("train loss", TRAIN_LOSS),
        ("eval loss", EVAL_LOSS),
    ]),
    ("bits sent so far by round, every run", [
        ("cumulative broadcast bits", board_tag(CUMULATIVE_BROADCAST_BITS)),
        ("cumulative aggregate bits", board_tag(CUMULATIVE_AGGREGATE_BITS)),
    ]),
)


def layout_proto(with_clock: bool = True):
  """The custom-scalars Layout of `LAYOUT`, without the chart by simulated
  time unless `with_clock`; each chart a margin chart (no smoothing) whose
  bounds are the value itself.

  A category's charts are listed last first: TensorBoard 2.14 draws a
  category's margin charts in the reverse of the layout's order (its line
  charts in order), as the screenshots of docs/tensorboard.md show.
  """
  from tensorboard.plugins.custom_scalar import layout_pb2  # pylint: disable=g-import-not-at-top
  series = layout_pb2.MarginChartContent.Series
  return layout_pb2.Layout(category=[
      layout_pb2.Category(title=title, chart=[
          layout_pb2.Chart(title=chart, margin=layout_pb2.MarginChartContent(
              series=[series(value=tag, lower=tag, upper=tag)]))
          for chart, tag in reversed(charts) if with_clock or chart != BY_SIMULATED_TIME])
      for title, charts in LAYOUT])


def models_clock(config: Mapping[str, Any]) -> bool:
  """True if a run of `config` (plain, as its config.yaml) models its clients'
  devices or links: `system.profiles` (bandwidths, latency, compute speed,
  availability) or a `system.speed` other than constant. Only such a run logs
  `eval/accuracy_by_simulated_ms` and gets its chart."""
  system = config.get("system") or {}
  return system.get("profiles") is not None or system.get("speed", "constant") != "constant"


def stored_target(experiment_dir: str | pathlib.Path) -> float | None:
  """The eval accuracy `fedsim compare --target` last gave for `experiment_dir`;
  None if none.

  Raises:
    UserError: naming the file, if it holds no number.
  """
  path = pathlib.Path(experiment_dir) / COMPARISON_RUN / TARGET_FILE
  try:
    text = path.read_text(encoding="utf-8")
  except FileNotFoundError:
    return None
  try:
    return float(text)
  except ValueError:
    raise UserError(f"{path}: not an eval accuracy: {text.strip()[:40]!r}"
                    " (delete it, or give `fedsim compare --target`)") from None


def refresh(experiment_dir: str | pathlib.Path,
            target: float | None = None) -> pathlib.Path | None:
  """Rewrites the comparison run of `experiment_dir` and the HParams session
  of each of its completed runs (see the module docstring).

  `target`, an eval accuracy, is kept for later refreshes and used for the
  HParams 'to target' metrics; None uses the kept one (`stored_target`), else
  `hparams.default_target`.

  Returns:
    The comparison run's directory; None if no run has completed.

  Raises:
    UserError: as `run_records.load_runs` (a run's files unreadable) or
      `stored_target`.
    OSError: if an event file or the target cannot be written.
  """
  # pylint: disable-next=g-import-not-at-top
  from tensorboard.plugins.custom_scalar import summary as cs_summary

  from fedsim.reporting.sinks import load_tensorflow  # pylint: disable=g-import-not-at-top
  experiment_dir = pathlib.Path(experiment_dir)
  board = experiment_dir / COMPARISON_RUN
  if target is not None:
    board.mkdir(parents=True, exist_ok=True)
    write_text_atomic(board / TARGET_FILE, f"{target!r}\n")
  else:
    target = stored_target(experiment_dir)
  try:
    runs = load_runs(experiment_dir)
  except UserError:
    if not any(experiment_dir.glob("*/config.yaml")):
      return None  # No run has logged a round yet.
    raise
  completed = [run for run in runs if run.status == "completed"]
  if not completed:
    return None
  tf = load_tensorflow()
  write_config = hparams.write_sessions(completed, target)
  image = _figure_pixels(experiment_dir, runs)
  layout = cs_summary.pb(layout_proto(any(models_clock(run.config) for run in completed))
                        ).SerializeToString()
  board.mkdir(exist_ok=True)
  old = sorted(board.glob(f"events.out.tfevents.*{BOARD_SUFFIX}"))
  old += sorted(experiment_dir.glob(f"events.out.tfevents.*{_OLD_CONFIG_SUFFIX}"))
  step = len(completed)  # the image's step: how many runs it shows complete
  hparams.write_events(tf, board, step, lambda: [
      write_config(),
      tf.summary.experimental.write_raw_pb(layout, step=step),
      tf.summary.image(FIGURE_TAG, image[np.newaxis], step=step,
                       description="eval accuracy against cumulative bits sent both ways"
                                   " (log axis), as `fedsim compare` draws it")],
                       BOARD_SUFFIX)
  hparams.unlink_all(old)  # TensorBoard would merge several layouts and show each figure.
  return board


def _figure_pixels(experiment_dir: pathlib.Path, runs: list) -> np.ndarray:
  """The accuracy-versus-bits figure of `runs` (the experiment's, every
  status) as an (height, width, 3) uint8 array."""
  figure = draw_accuracy(experiment_dir, "bits", runs)
  return np.asarray(figure.canvas.buffer_rgba())[:, :, :3].copy()
