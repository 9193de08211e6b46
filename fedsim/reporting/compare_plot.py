"""`fedsim compare`'s figures: eval accuracy against cumulative bits (log
axis) and against rounds, one line per run or per variant over seeds."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Sequence

from fedsim.errors import host_error
from fedsim.reporting import seed_groups
from fedsim.reporting.run_records import ACCURACY, Run, load_runs
from fedsim.reporting.rundir import PLOT_NAME, ROUNDS_PLOT_NAME
from fedsim.reporting.units import format_bits, format_bits_ticks


def plot_accuracy_vs_bits(experiment_dir: str | os.PathLike,
                          output: str | os.PathLike | None = None) -> pathlib.Path:
  """Plots eval accuracy against cumulative bits (broadcast + aggregate), log x.

  One line per run that has evaluated at least once; a variant run under
  several seeds is one line (the seeds' mean, at their mean bits) inside a
  band of mean +- the 95% t-interval (see `seed_groups.py`). Uses matplotlib's Agg
  canvas directly, so the global backend (e.g. a notebook's) is untouched.

  Args:
    experiment_dir: the experiment directory, as for `load_runs`.
    output: the PNG file; default `<experiment_dir>/accuracy_vs_bits.png`.

  Returns:
    The path of the written PNG.

  Raises:
    UserError: as `load_runs`.
    HostError: the PNG cannot be written.
  """
  return _plot(experiment_dir, output or pathlib.Path(experiment_dir) / PLOT_NAME, "bits")


def plot_accuracy_vs_rounds(experiment_dir: str | os.PathLike,
                            output: str | os.PathLike | None = None) -> pathlib.Path:
  """Plots eval accuracy against rounds, with seed bands as `plot_accuracy_vs_bits`.

  Returns the written PNG (default `<experiment_dir>/accuracy_vs_rounds.png`);
  raises as `plot_accuracy_vs_bits`.
  """
  return _plot(experiment_dir, output or pathlib.Path(experiment_dir) / ROUNDS_PLOT_NAME,
               "rounds")


# Cycled per line with coprime periods (8 markers, 4 line styles; colours
# cycle by 10), so two overlapping curves differ in more than colour.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINE_STYLES = ("-", "--", "-.", ":")
_MARKERS_PER_LINE = 12   # a long curve shows about this many markers
# A legend of more lines goes right of the axes, in columns of at most
# `_LEGEND_ROWS` entries (what a 4.5 in figure holds at the small font), each
# column widening the figure by its key and its longest label (at most about
# this much per character of the small font).
_LEGEND_INSIDE = 10
_LEGEND_ROWS = 20
_LEGEND_KEY_INCHES = 0.7
_LEGEND_CHAR_INCHES = 0.07


def _plot(experiment_dir, output, x: str) -> pathlib.Path:
  """Draws eval accuracy against `x` ('bits', log scale, or 'rounds') into `output`."""
  figure = draw_accuracy(experiment_dir, x)
  try:
    figure.savefig(output, format="png")
  except OSError as e:  # the machine's (a read-only or full disk), as the tables' writes
    raise host_error(e, output) from None
  return pathlib.Path(output)


def draw_accuracy(experiment_dir: str | os.PathLike, x: str = "bits",
                  runs: Sequence[Run] | None = None) -> Any:
  """The matplotlib Figure of eval accuracy against `x` ('bits' or 'rounds'),
  drawn (tick labels final) but not saved; see `plot_accuracy_vs_bits`.
  `runs`: the experiment's runs if the caller has read them (`load_runs`).

  Raises:
    UserError: as `load_runs`.
  """
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  groups = seed_groups.group_by_seed(load_runs(experiment_dir) if runs is None else runs)
  figure = Figure(figsize=(7, 4.5), dpi=100)
  canvas = FigureCanvasAgg(figure)
  axes = figure.add_subplot()
  plotted = 0
  for group in groups:
    xs, mean, half = seed_groups.curve(group, x)
    if not len(xs) or (x == "bits" and not all(xs > 0)):  # log axis: zero bits cannot be placed
      continue
    run = group.runs[0]
    if len(group.runs) > 1:
      label = f"{group.label} ({len(group.runs)} seeds, 95% band)"
    else:
      label = run.name if run.status in ("completed", "unknown") else f"{run.name} ({run.status})"
    line, = axes.plot(xs, mean, label=label, marker=_MARKERS[plotted % len(_MARKERS)],
                      linestyle=_LINE_STYLES[plotted % len(_LINE_STYLES)], markersize=4,
                      markevery=max(1, len(xs) // _MARKERS_PER_LINE))
    if len(group.runs) > 1:
      axes.fill_between(xs, mean - half, mean + half, color=line.get_color(), alpha=0.2)
    plotted += 1
  if x == "bits":
    axes.set_xscale("log", base=2)
    # Ticks on powers of two read as round binary units, one unit per axis.
    axes.xaxis.set_major_locator(ticker.LogLocator(base=2, numticks=8))
    axes.xaxis.set_major_formatter(_bits_formatter())
    axes.xaxis.set_minor_formatter(ticker.NullFormatter())
    axes.set_xlabel("cumulative bits communicated (broadcast + aggregate)")
  else:
    axes.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    axes.set_xlabel("round")
  axes.set_ylabel(ACCURACY)
  axes.set_title(pathlib.Path(experiment_dir).resolve().name)
  axes.grid(True, which="both", alpha=0.3)
  if plotted:
    _place_legend(figure, axes, plotted)
  figure.tight_layout()
  canvas.draw()
  return figure


def _place_legend(figure: Any, axes: Any, entries: int) -> None:
  """A legend inside the axes for up to `_LEGEND_INSIDE` lines; beyond that
  (a sweep of many variants) in columns right of the axes, the figure widened
  to hold them: inside, 40 entries hid the curves, and taller than the figure
  they left no room for the axes (matplotlib's tight layout gave up)."""
  if entries <= _LEGEND_INSIDE:
    axes.legend()
    return
  columns = -(-entries // _LEGEND_ROWS)
  longest = max(len(label) for label in axes.get_legend_handles_labels()[1])
  column = _LEGEND_KEY_INCHES + _LEGEND_CHAR_INCHES * longest
  figure.set_size_inches(figure.get_figwidth() + column * columns, figure.get_figheight())
  axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
              fontsize="small", ncols=columns)


def _bits_formatter() -> Any:
  """A matplotlib Formatter labelling all visible ticks of a bits axis at once
  with `format_bits_ticks` (defined here: matplotlib is imported lazily)."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top

  class BitsFormatter(ticker.Formatter):

    def __call__(self, bits, pos=None):
      return format_bits(bits) if bits > 0 else ""

    def format_ticks(self, values):
      low, high = sorted(self.axis.get_view_interval()) if self.axis else (-1, float("inf"))
      # Ticks outside the view are not drawn: they must not choose the unit.
      visible = [v for v in values if low <= v <= high]
      labels = dict(zip(visible, format_bits_ticks(visible)))
      return [labels.get(v, "") for v in values]

  return BitsFormatter()
