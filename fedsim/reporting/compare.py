"""Comparing the runs of one experiment by accuracy and by bits on the wire.

Everything is read back from what runs wrote (`config.yaml`, `metrics.csv`,
`status`), so a comparison needs neither TensorFlow nor the runs' process,
and works on runs still going or cut short.

Ratios vs. uncompressed are per client and per round, from the runs' own
`*_bits_per_client` columns: the reference is a run of the same experiment
that sends the same model uncompressed. Without such a run the ratio is not
known and is reported as such rather than estimated from a formula.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Mapping, Sequence

import yaml

from fedsim.config.typed import Component
from fedsim.errors import UserError
from fedsim.reporting import seeds as seed_groups
from fedsim.reporting.rundir import read_status
from fedsim.reporting.sinks import read_metrics_csv
from fedsim.reporting.units import format_bits, format_bits_ticks

PLOT_NAME = "accuracy_vs_bits.png"
ROUNDS_PLOT_NAME = "accuracy_vs_rounds.png"
_ACCURACY = "eval/accuracy"
_DIRECTIONS = ("broadcast", "aggregate")
# Encoders that send every tensor as it is: a run using only these is a reference.
_LOSSLESS_ENCODERS = frozenset({"identity"})


@dataclasses.dataclass(frozen=True)
class Run:
  """One run directory as written by fedsim: name, status, config and metrics."""

  name: str
  path: pathlib.Path
  status: str                      # 'completed', 'failed', 'interrupted', 'running' or 'unknown'
  message: str                     # why a run failed, from its status file
  config: Mapping[str, Any]        # the resolved config.yaml
  metrics: Sequence[Mapping[str, float]]  # one dict per round, as in metrics.csv

  @property
  def uncompressed(self) -> bool:
    """True if neither direction encodes anything (no or only lossless encoders)."""
    compression = self.config.get("compression") or {}
    encoders = [(spec or {}).get("encoder") for spec in compression.values()]
    stages = [(direction, stage) for direction in ("aggregation", "broadcast")
              for stage in self.config.get(direction) or ()]
    encoders += [stage.get("encoder") for _, stage in stages if stage.get("name") == "encode"]
    return all(encoder in _LOSSLESS_ENCODERS for encoder in encoders) and not any(
        _compresses(direction, stage.get("name")) for direction, stage in stages
        if stage.get("name") != "encode")

  def total_bits(self, direction: str, entropy: bool = False) -> int | None:
    """Bits sent in `direction` ('broadcast'/'aggregate') over the recorded rounds.

    `entropy`: what an entropy coder would have sent instead, from the
    `<direction>_entropy_bits` columns; None if the run did not record them.
    """
    if not self.metrics:
      return None
    name = f"{direction}_entropy_bits" if entropy else f"{direction}_bits"
    cumulative = self.metrics[-1].get(f"cumulative_{name}")
    if cumulative is not None:
      return int(cumulative)
    if entropy and not any(name in row for row in self.metrics):
      return None
    return int(sum(row.get(name, 0) for row in self.metrics))

  def mean_bits_per_client(self, direction: str) -> float | None:
    """Mean over rounds of `<direction>_bits_per_client`; None if never recorded."""
    values = [row[f"{direction}_bits_per_client"] for row in self.metrics
              if f"{direction}_bits_per_client" in row]
    return sum(values) / len(values) if values else None

  def accuracy_vs_bits(self) -> tuple[list[float], list[float]]:
    """(cumulative broadcast + aggregate bits, eval accuracy) at each eval round."""
    bits, accuracy = [], []
    for row in self.metrics:
      if _ACCURACY in row:
        bits.append(row.get("cumulative_broadcast_bits", 0)
                    + row.get("cumulative_aggregate_bits", 0))
        accuracy.append(row[_ACCURACY])
    return bits, accuracy

  def to_target(self, target: float) -> dict[str, float] | None:
    """Where the run first evaluated at `target` accuracy or above: its round,
    cumulative bits (both directions) and simulated seconds; None if never."""
    for row in self.metrics:
      if row.get(_ACCURACY, -1.0) >= target:
        return {"round": row.get("round"),
                "bits": row.get("cumulative_broadcast_bits", 0)
                        + row.get("cumulative_aggregate_bits", 0),
                "seconds": row.get("simulated_seconds")}
    return None

  def within_budget(self, budget: float) -> dict[str, float] | None:
    """The best eval accuracy among evaluations made with at most `budget`
    cumulative bits (broadcast + aggregate) sent: its 'accuracy', 'round' and
    'bits' (the earliest round on ties); None if no evaluation fits. A run
    that ended below the budget counts all its evaluations."""
    best = None
    for bits, accuracy, round_num in zip(*self.accuracy_vs_bits(), self._eval_rounds()):
      if bits <= budget and (best is None or accuracy > best["accuracy"]):
        best = {"accuracy": accuracy, "round": round_num, "bits": bits}
    return best

  def _eval_rounds(self) -> list[float | None]:
    return [row.get("round") for row in self.metrics if _ACCURACY in row]


def _compresses(direction: str, name: Any) -> bool:
  """True if the registered stage `name` of `direction` sends something
  other than the update itself (e.g. `majority_vote`'s sign bits)."""
  from fedsim.aggregation import AGGREGATION_STAGES, BROADCAST_STAGES, is_compressing
  registry = AGGREGATION_STAGES if direction == "aggregation" else BROADCAST_STAGES
  try:
    return is_compressing(registry, Component(name, None))
  except UserError:   # a plugin's stage, not imported here: assume it does not
    return False


def _read_config(path: pathlib.Path) -> Mapping[str, Any]:
  try:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
    raise UserError(f"{path}: cannot read run config ({e.__class__.__name__})") from None
  if not isinstance(data, dict):
    raise UserError(f"{path}: not a fedsim run config (expected a mapping)")
  return data


def _is_run_dir(path: pathlib.Path) -> bool:
  return (path / "metrics.csv").is_file() and (path / "config.yaml").is_file()


def load_runs(experiment_dir: str | os.PathLike) -> list[Run]:
  """Reads every run directory directly under `experiment_dir`.

  A run directory holds `metrics.csv` and `config.yaml`; other entries are
  skipped. Runs are ordered by when they started (config.yaml's mtime), then
  by name, so variants appear in the order `fedsim run` ran them.

  Returns:
    The runs, possibly failed or still running.

  Raises:
    UserError: naming the path, if it is not a directory, holds no run, is
      itself a run directory, or a run's files cannot be read.
  """
  root = pathlib.Path(experiment_dir)
  if not root.exists():
    raise UserError(f"{root}: no such directory")
  if not root.is_dir():
    raise UserError(f"{root}: not a directory (expected an experiment directory such as"
                    " runs/<name>)")
  if _is_run_dir(root):
    raise UserError(f"{root}: is a single run; pass its experiment directory {root.parent}")
  found = sorted((p for p in root.iterdir()
                  if not p.name.startswith(".") and p.is_dir() and _is_run_dir(p)),
                 key=lambda p: ((p / "config.yaml").stat().st_mtime_ns, p.name))
  if not found:
    raise UserError(f"{root}: no run directories (with metrics.csv and config.yaml) in it")
  runs = []
  for path in found:
    status, message = read_status(path)
    runs.append(Run(name=path.name, path=path, status=status or "unknown", message=message,
                    config=_read_config(path / "config.yaml"),
                    metrics=read_metrics_csv(path / "metrics.csv")))
  return runs


def _reference_for(run: Run, runs: Sequence[Run]) -> Run | None:
  """The uncompressed run that sends the same model as `run`, if any.

  Among several, one of the same algorithm wins, then a completed one, then
  the first in run order: all of them send the same model bits.
  """
  candidates = [r for r in runs if r.uncompressed and r.config.get("model") == run.config.get(
      "model") and r.mean_bits_per_client("broadcast") is not None]
  if not candidates:
    return None
  algorithm = (run.config.get("algorithm") or {}).get("name")
  return min(candidates, key=lambda r: (
      (r.config.get("algorithm") or {}).get("name") != algorithm, r.status != "completed"))


def compare_runs(experiment_dir: str | os.PathLike, target: float | None = None,
                 budget: float | None = None) -> list[dict[str, Any]]:
  """The comparison table of an experiment, one dict per run (for notebooks).

  Keys: 'variant' (run directory name), 'status', 'rounds' (recorded),
  'eval/accuracy' (last evaluated; None if never), 'broadcast_bits' and
  'aggregate_bits' (totals over the recorded rounds, bits), 'broadcast_ratio'
  and 'aggregate_ratio' (the reference's bits per client / this run's:
  how many times less it sends; None without a reference), 'reference' (the
  uncompressed run the ratios are relative to, or None), 'privacy/epsilon'
  (the last logged epsilon of a differentially private run, else None). With
  `target` (an eval accuracy), also 'target_round', 'target_bits' (cumulative
  bits both ways) and 'target_seconds' (simulated) where the run first
  reached it, None if it never did. With `budget` (bits, both directions
  together), also 'budget' (that number), 'budget_accuracy' and
  'budget_round': the best eval accuracy among the evaluations made within
  the budget and its round (see `Run.within_budget`), None if none fits.
  When a run recorded entropy-coded sizes, 'broadcast_entropy_bits' and
  'aggregate_entropy_bits' hold their totals (else None).

  Raises:
    UserError: as `load_runs`.
  """
  runs = load_runs(experiment_dir)
  rows = []
  for run in runs:
    reference = _reference_for(run, runs)
    row: dict[str, Any] = {
        "variant": run.name,
        "status": run.status,
        "rounds": len(run.metrics),
        _ACCURACY: _last_accuracy(run),
    }
    for direction in _DIRECTIONS:
      row[f"{direction}_bits"] = run.total_bits(direction)
    for direction in _DIRECTIONS:
      row[f"{direction}_entropy_bits"] = run.total_bits(direction, entropy=True)
    for direction in _DIRECTIONS:
      mine = run.mean_bits_per_client(direction)
      ratio = None
      if reference is not None and mine:
        ratio = reference.mean_bits_per_client(direction) / mine
      row[f"{direction}_ratio"] = ratio
    row["reference"] = reference.name if reference is not None else None
    row[_EPSILON] = next((r[_EPSILON] for r in reversed(run.metrics) if _EPSILON in r), None)
    if target is not None:
      reached = run.to_target(target) or {}
      for key in ("round", "bits", "seconds"):
        row[f"target_{key}"] = reached.get(key)
    if budget is not None:
      within = run.within_budget(budget) or {}
      row.update(budget=budget, budget_accuracy=within.get("accuracy"),
                 budget_round=within.get("round"))
    rows.append(row)
  return rows


def compare_seeds(experiment_dir: str | os.PathLike) -> list[dict[str, Any]]:
  """One dict per variant over its seeds (runs whose configs differ only by `seed`).

  Keys: 'variant' (run name without '-seed<N>'), 'seeds' (list), 'runs'
  (their directory names), 'eval/accuracy' (mean over the seeds' last
  evaluated accuracy; None if none evaluated), 'eval/accuracy_interval'
  (half-width of the 95% t-interval, see `seeds.mean_interval`; None for
  fewer than 2 seeds), 'bits' (mean total bits, broadcast + aggregate) and
  'bits_interval' (None when every seed sent the same bits).

  Raises:
    UserError: as `load_runs`.
  """
  rows = []
  for group in seed_groups.group_by_seed(load_runs(experiment_dir)):
    accuracy = [a for a in (_last_accuracy(run) for run in group.runs) if a is not None]
    bits = [sum(run.total_bits(d) or 0 for d in _DIRECTIONS) for run in group.runs]
    mean, half = seed_groups.mean_interval(accuracy) if accuracy else (None, None)
    bits_mean, bits_half = seed_groups.mean_interval(bits)
    rows.append({"variant": group.label, "seeds": list(group.seeds),
                 "runs": [run.name for run in group.runs],
                 _ACCURACY: mean, f"{_ACCURACY}_interval": half,
                 "bits": bits_mean, "bits_interval": bits_half if len(set(bits)) > 1 else None})
  return rows


def _last_accuracy(run: Run) -> float | None:
  return next((r[_ACCURACY] for r in reversed(run.metrics) if _ACCURACY in r), None)


def format_seed_comparison(rows: Sequence[Mapping[str, Any]]) -> str:
  """The rows of `compare_seeds` as a text table, with a line saying what the interval is."""
  def pm(mean, half, kind):
    text = _cell(mean, kind)
    return text if half is None else f"{text} +- {_cell(half, kind)}"
  table = [["variant", "seeds", "eval/accuracy (mean +- 95%)", "bits (mean +- 95%)"]]
  table += [[row["variant"], ",".join(map(str, row["seeds"])),
             pm(row[_ACCURACY], row[f"{_ACCURACY}_interval"], "accuracy"),
             pm(row["bits"], row["bits_interval"], "bits")] for row in rows]
  widths = [max(len(line[i]) for line in table) for i in range(4)]
  lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                     for i, (cell, w) in enumerate(zip(line, widths))).rstrip()
           for line in table]
  lines.append("+-: half-width of the 95% t-interval over seeds,"
               " t(0.975, n-1) * s / sqrt(n), s the sample std of the n seeds")
  return "\n".join(lines)


def _cell(value: Any, kind: str) -> str:
  if value is None:
    return "n/a" if kind == "ratio" else "-"
  return {"accuracy": lambda v: f"{v:.4f}", "bits": format_bits,
          "ratio": lambda v: f"{v:.2f}x", "epsilon": lambda v: f"{v:.4g}",
          "round": lambda v: str(int(v)),
          "hours": lambda v: f"{v / 3600:.4g}"}.get(kind, str)(value)


_COLUMNS = (("variant", "variant", "text"), ("status", "status", "text"),
            ("rounds", "rounds", "text"), (_ACCURACY, "eval/accuracy", "accuracy"),
            ("broadcast_bits", "broadcast", "bits"), ("aggregate_bits", "aggregate", "bits"),
            ("broadcast_ratio", "broadcast ratio", "ratio"),
            ("aggregate_ratio", "aggregate ratio", "ratio"))
_EPSILON = "privacy/epsilon"
_EPSILON_COLUMN = (_EPSILON, "epsilon", "epsilon")
_ENTROPY_COLUMNS = (("broadcast_entropy_bits", "broadcast entropy", "bits"),
                    ("aggregate_entropy_bits", "aggregate entropy", "bits"))
_TARGET_COLUMNS = (("target_round", "round to target", "round"),
                   ("target_bits", "bits to target", "bits"),
                   ("target_seconds", "sim. hours to target", "hours"))


def format_comparison(rows: Sequence[Mapping[str, Any]]) -> str:
  """The rows of `compare_runs` as an aligned text table plus a note on ratios
  (and an epsilon column when a run is differentially private, entropy-coded
  totals when a run recorded them, the target and budget columns when asked)."""
  columns = _COLUMNS
  if any(r.get(key) is not None for r in rows for key, _, _ in _ENTROPY_COLUMNS):
    columns = columns[:6] + _ENTROPY_COLUMNS + columns[6:]
  if any(r.get(_EPSILON) is not None for r in rows):
    columns += (_EPSILON_COLUMN,)
  if any("target_round" in r for r in rows):
    columns += _TARGET_COLUMNS
  budgets = {r["budget"] for r in rows if "budget" in r}
  if budgets:
    budget = format_bits_ticks([max(budgets)])[0]
    columns += (("budget_accuracy", f"best acc. within {budget}", "accuracy"),
                ("budget_round", "at round", "round"))
  table = [[title for _, title, _ in columns]]
  table += [[_cell(row.get(key), kind) for key, _, kind in columns] for row in rows]
  widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
  lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                     for i, (cell, w) in enumerate(zip(line, widths))).rstrip()
           for line in table]
  references = sorted({row["reference"] for row in rows if row.get("reference")})
  if references:
    lines.append(f"ratio: bits per client of the uncompressed run"
                 f" ({', '.join(references)}) / this run's; higher sends less")
  else:
    lines.append("ratio: n/a, no uncompressed run of the same model in this experiment")
  return "\n".join(lines)


def plot_accuracy_vs_bits(experiment_dir: str | os.PathLike,
                          output: str | os.PathLike | None = None) -> pathlib.Path:
  """Plots eval accuracy against cumulative bits (broadcast + aggregate), log x.

  One line per run that has evaluated at least once; a variant run under
  several seeds is one line (the seeds' mean, at their mean bits) inside a
  band of mean +- the 95% t-interval (see `seeds.py`). Uses matplotlib's Agg
  canvas directly, so the global backend (e.g. a notebook's) is untouched.

  Args:
    experiment_dir: the experiment directory, as for `load_runs`.
    output: the PNG file; default `<experiment_dir>/accuracy_vs_bits.png`.

  Returns:
    The path of the written PNG.

  Raises:
    UserError: as `load_runs`, or if the PNG cannot be written.
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


def _plot(experiment_dir, output, x: str) -> pathlib.Path:
  """Draws eval accuracy against `x` ('bits', log scale, or 'rounds') into `output`."""
  figure = draw_accuracy(experiment_dir, x)
  try:
    figure.savefig(output, format="png")
  except OSError as e:
    raise UserError(f"cannot write plot {output}: {e.strerror or e}") from None
  return pathlib.Path(output)


def draw_accuracy(experiment_dir: str | os.PathLike, x: str = "bits") -> Any:
  """The matplotlib Figure of eval accuracy against `x` ('bits' or 'rounds'),
  drawn (tick labels final) but not saved; see `plot_accuracy_vs_bits`.

  Raises:
    UserError: as `load_runs`.
  """
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  groups = seed_groups.group_by_seed(load_runs(experiment_dir))
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
  axes.set_ylabel(_ACCURACY)
  axes.set_title(pathlib.Path(experiment_dir).resolve().name)
  axes.grid(True, which="both", alpha=0.3)
  if plotted:
    axes.legend()
  figure.tight_layout()
  canvas.draw()
  return figure


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
