"""The experiment directory as TensorBoard shows it (`tensorboard --logdir
<logdir>/<name>`): one run per run directory, plus one run, `comparison/`,
holding what belongs to the experiment rather than to a run:

* the custom-scalars layout (Custom Scalars tab): accuracy by round, by
  cumulative bits and by simulated time first, each chart with every run;
* the HParams config (columns and ranking metrics, see `hparams`);
* `fedsim compare`'s accuracy-versus-bits figure (log bits axis) as an image
  (Images tab).

`refresh` rewrites all of it, and every completed run's HParams session,
whenever a run completes: the comparison run's event file is replaced, so
TensorBoard shows the newest figure and layout only.
"""

from __future__ import annotations

import pathlib

import numpy as np

from fedsim.errors import UserError
from fedsim.metric_names import (CUMULATIVE_AGGREGATE_BITS, CUMULATIVE_BROADCAST_BITS,
                                 EVAL_ACCURACY, EVAL_ACCURACY_BY_BITS,
                                 EVAL_ACCURACY_BY_SIMULATED_MS, EVAL_LOSS, TRAIN_LOSS)
from fedsim.reporting import hparams
from fedsim.reporting.compare_plot import draw_accuracy
from fedsim.reporting.run_records import load_runs

COMPARISON_RUN = "comparison"
BOARD_SUFFIX = ".fedsim-board"
FIGURE_TAG = "comparison/accuracy_vs_bits"
# Where fedsim versions before the comparison run wrote the HParams config
# (TensorBoard showed it as a run named '.').
_OLD_CONFIG_SUFFIX = ".fedsim-hparams"

# (category, [(chart title, tag regex)]): each chart draws its tags of every run.
LAYOUT = (
    ("accuracy, every run", [
        ("eval accuracy by round", f"^{EVAL_ACCURACY}$"),
        ("eval accuracy by cumulative bits sent (broadcast + aggregate)",
         f"^{EVAL_ACCURACY_BY_BITS}$"),
        ("eval accuracy by simulated milliseconds", f"^{EVAL_ACCURACY_BY_SIMULATED_MS}$"),
    ]),
    ("loss and bits by round, every run", [
        ("train loss", f"^{TRAIN_LOSS}$"),
        ("eval loss", f"^{EVAL_LOSS}$"),
        ("cumulative bits, broadcast and aggregate",
         f"^({CUMULATIVE_BROADCAST_BITS}|{CUMULATIVE_AGGREGATE_BITS})$"),
    ]),
)


def layout_proto():
  """The custom-scalars Layout of `LAYOUT`."""
  from tensorboard.plugins.custom_scalar import layout_pb2  # pylint: disable=g-import-not-at-top
  return layout_pb2.Layout(category=[
      layout_pb2.Category(title=title, chart=[
          layout_pb2.Chart(title=chart, multiline=layout_pb2.MultilineChartContent(tag=[tag]))
          for chart, tag in charts])
      for title, charts in LAYOUT])


def refresh(experiment_dir: str | pathlib.Path) -> pathlib.Path | None:
  """Rewrites the comparison run of `experiment_dir` and the HParams session
  of each of its completed runs (see the module docstring).

  Returns:
    The comparison run's directory; None if no run has completed.

  Raises:
    UserError: as `run_records.load_runs` (a run's files unreadable).
    OSError: if an event file cannot be written.
  """
  # pylint: disable-next=g-import-not-at-top
  from tensorboard.plugins.custom_scalar import summary as cs_summary

  from fedsim.reporting.sinks import load_tensorflow  # pylint: disable=g-import-not-at-top
  experiment_dir = pathlib.Path(experiment_dir)
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
  write_config = hparams.write_sessions(completed)
  image = _figure_pixels(experiment_dir)
  layout = cs_summary.pb(layout_proto()).SerializeToString()
  board = experiment_dir / COMPARISON_RUN
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


def _figure_pixels(experiment_dir: pathlib.Path) -> np.ndarray:
  """The accuracy-versus-bits figure as an (height, width, 3) uint8 array."""
  figure = draw_accuracy(experiment_dir, "bits")
  return np.asarray(figure.canvas.buffer_rgba())[:, :, :3].copy()
