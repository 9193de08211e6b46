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

import csv
import io
import os
import pathlib
from typing import Any, Mapping, Sequence

from fedsim.reporting import seed_groups
# The table and the figures, named here too for callers of fedsim.reporting.compare.
from fedsim.reporting.compare_plot import (draw_accuracy, plot_accuracy_vs_bits,
                                           plot_accuracy_vs_rounds)
from fedsim.reporting.compare_table import (EPSILON, WIDTH, format_comparison,
                                            format_seed_comparison, format_seed_markdown)
from fedsim.reporting.run_records import ACCURACY, Run, load_runs
from fedsim.reporting.rundir import RESULT_NAME

__all__ = ["Run", "WIDTH", "compare_runs", "compare_seeds",
           "draw_accuracy", "format_comparison", "format_seed_comparison", "load_runs",
           "plot_accuracy_vs_bits", "plot_accuracy_vs_rounds", "write_seed_table"]
_DIRECTIONS = ("broadcast", "aggregate")


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
        ACCURACY: _last_accuracy(run),
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
    row[EPSILON] = next((r[EPSILON] for r in reversed(run.metrics) if EPSILON in r), None)
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
  (half-width of the 95% t-interval, see `seed_groups.mean_interval`; None for
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
    per_round = [b / len(run.metrics) for b, run in zip(bits, group.runs) if run.metrics]
    round_mean, round_half = (seed_groups.mean_interval(per_round) if per_round
                              else (None, None))
    rows.append({"variant": group.label, "seeds": list(group.seeds),
                 "runs": [run.name for run in group.runs],
                 ACCURACY: mean, f"{ACCURACY}_interval": half,
                 "bits": bits_mean, "bits_interval": bits_half if len(set(bits)) > 1 else None,
                 "bits_per_round": round_mean,
                 "bits_per_round_interval": round_half if len(set(per_round)) > 1 else None})
  return rows


def _csv_cell(value: Any) -> str:
  """Seeds space-separated, floats exactly (repr), none as ''."""
  if value is None:
    return ""
  if isinstance(value, (list, tuple)):
    return " ".join(map(str, value))
  return repr(value) if isinstance(value, float) else str(value)


def write_seed_table(experiment_dir: str | os.PathLike,
                     rows: Sequence[Mapping[str, Any]]) -> list[pathlib.Path]:
  """Writes the rows of `compare_seeds` into `experiment_dir` as
  study_result.md (a Markdown table) and study_result.csv (one column per
  value, intervals as half-widths; empty where none). Returns both paths.

  Raises:
    OSError: a file cannot be written.
  """
  from fedsim.reporting.rundir import write_text_atomic
  experiment_dir = pathlib.Path(experiment_dir)
  keys = ("variant", "seeds", ACCURACY, f"{ACCURACY}_interval", "bits", "bits_interval",
          "bits_per_round", "bits_per_round_interval")
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(keys)
  for row in rows:
    writer.writerow([_csv_cell(row[k]) for k in keys])
  csv_path = experiment_dir / f"{RESULT_NAME}.csv"
  write_text_atomic(csv_path, out.getvalue())
  md_path = experiment_dir / f"{RESULT_NAME}.md"
  write_text_atomic(md_path, format_seed_markdown(rows) + "\n")
  return [md_path, csv_path]


def _last_accuracy(run: Run) -> float | None:
  return next((r[ACCURACY] for r in reversed(run.metrics) if ACCURACY in r), None)
