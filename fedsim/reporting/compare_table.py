"""`fedsim compare`'s tables as text: one row per run, and one per variant over
seeds. A table wider than the terminal's 120 columns leaves out its details
(entropy-coded totals) and then wraps its columns into blocks, each led by
the variant; `width=None` (`fedsim compare --wide`) prints everything in one.
"""

from __future__ import annotations

import textwrap
from typing import Any, Mapping, Sequence

from fedsim.reporting.run_records import ACCURACY
from fedsim.reporting.units import format_bits, format_bits_ticks

WIDTH = 120
EPSILON = "privacy/epsilon"

# (row key, title, kind): text columns are left-aligned, the rest right-aligned.
Column = tuple[str, str, str]
_COLUMNS = (("variant", "variant", "text"), ("status", "status", "text"),
            ("rounds", "rounds", "text"), (ACCURACY, "eval/accuracy", "accuracy"),
            ("broadcast_bits", "broadcast", "bits"), ("aggregate_bits", "aggregate", "bits"),
            ("broadcast_ratio", "broadcast ratio", "ratio"),
            ("aggregate_ratio", "aggregate ratio", "ratio"))
_EPSILON_COLUMN = (EPSILON, "epsilon", "epsilon")
_ENTROPY_COLUMNS = (("broadcast_entropy_bits", "broadcast entropy", "bits"),
                    ("aggregate_entropy_bits", "aggregate entropy", "bits"))
_TARGET_COLUMNS = (("target_round", "round to target", "round"),
                   ("target_bits", "bits to target", "bits"),
                   ("target_seconds", "sim. hours to target", "hours"))


def format_comparison(rows: Sequence[Mapping[str, Any]], width: int | None = WIDTH) -> str:
  """The rows of `compare_runs` as an aligned text table plus a note on ratios
  (and an epsilon column when a run is differentially private, entropy-coded
  totals when a run recorded them, the target and budget columns when asked).

  `width`: the characters a line may take; a wider table leaves out the
  entropy-coded totals (saying so), then wraps into blocks of columns, each
  led by the variant. None: one table with every column, however wide.
  """
  columns = _COLUMNS
  if any(r.get(key) is not None for r in rows for key, _, _ in _ENTROPY_COLUMNS):
    columns = columns[:6] + _ENTROPY_COLUMNS + columns[6:]
  if any(r.get(EPSILON) is not None for r in rows):
    columns += (_EPSILON_COLUMN,)
  if any("target_round" in r for r in rows):
    columns += _TARGET_COLUMNS
  budgets = {r["budget"] for r in rows if "budget" in r}
  if budgets:
    budget = format_bits_ticks([max(budgets)])[0]
    columns += (("budget_accuracy", f"best acc. within {budget}", "accuracy"),
                ("budget_round", "at round", "round"))
  notes = []
  references = sorted({row["reference"] for row in rows if row.get("reference")})
  if references:
    notes.append(f"ratio: bits per client of the uncompressed run"
                 f" ({', '.join(references)}) / this run's; higher sends less")
  else:
    notes.append("ratio: n/a, no uncompressed run of the same model in this experiment")
  cells = {column: [_cell(row.get(column[0]), column[2]) for row in rows] for column in columns}
  if width is not None and _width(cells, columns) > width and set(_ENTROPY_COLUMNS) & set(columns):
    columns = tuple(c for c in columns if c not in _ENTROPY_COLUMNS)
    notes.append(f"entropy-coded totals left out to fit {width} columns; fedsim compare"
                 " --wide shows every column")
  blocks = [columns] if width is None else _blocks(cells, columns, width)
  tables = ["\n".join(_aligned(cells, block)) for block in blocks]
  return "\n\n".join(tables) + "\n" + "\n".join(_wrapped(notes, width))


def _width(cells: Mapping[Column, list[str]], columns: Sequence[Column]) -> int:
  """Characters of a line of the table of `columns` (two spaces between columns)."""
  return sum(_column_width(cells, c) for c in columns) + 2 * (len(columns) - 1)


def _column_width(cells: Mapping[Column, list[str]], column: Column) -> int:
  return max([len(column[1]), *map(len, cells[column])])


def _blocks(cells: Mapping[Column, list[str]], columns: Sequence[Column],
            width: int) -> list[tuple[Column, ...]]:
  """`columns` cut into consecutive blocks no wider than `width`, each after the
  first column (the variant); a column too wide alone still gets a block."""
  lead, *rest = columns
  blocks, block = [], [lead]
  for column in rest:
    if len(block) > 1 and _width(cells, [*block, column]) > width:
      blocks.append(tuple(block))
      block = [lead]
    block.append(column)
  blocks.append(tuple(block))
  return blocks


def _aligned(cells: Mapping[Column, list[str]], columns: Sequence[Column]) -> list[str]:
  """The lines of one table: titles, then one line per row."""
  widths = [_column_width(cells, c) for c in columns]
  lines = [[c[1] for c in columns]] + [list(line) for line in zip(*(cells[c] for c in columns))]
  return ["  ".join(cell.ljust(w) if column[2] == "text" else cell.rjust(w)
                    for cell, w, column in zip(line, widths, columns)).rstrip()
          for line in lines]


def _wrapped(notes: Sequence[str], width: int | None) -> list[str]:
  return [line for note in notes
          for line in (textwrap.wrap(note, width) if width else [note])]


def _seed_cells(rows: Sequence[Mapping[str, Any]]) -> tuple[tuple, dict]:
  """(columns, cells) of the seed table: mean +- half-width per value."""
  def pm(row, key, kind):
    text = _cell(row[key], kind)
    half = row.get(f"{key}_interval")
    return text if half is None else f"{text} +- {_cell(half, kind)}"
  columns = (("variant", "variant", "text"), ("seeds", "seeds", "text"),
             (ACCURACY, "eval/accuracy (mean +- 95%)", "accuracy"),
             ("bits", "bits (mean +- 95%)", "bits"),
             ("bits_per_round", "bits per round (mean +- 95%)", "bits"))
  cells = {columns[0]: [row["variant"] for row in rows],
           columns[1]: [",".join(map(str, row["seeds"])) for row in rows],
           **{column: [pm(row, column[0], column[2]) for row in rows] for column in columns[2:]}}
  return columns, cells


_SEED_NOTE = ("+-: half-width of the 95% t-interval over seeds,"
              " t(0.975, n-1) * s / sqrt(n), s the sample std of the n seeds")


def format_seed_comparison(rows: Sequence[Mapping[str, Any]], width: int | None = WIDTH) -> str:
  """The rows of `compare_seeds` as a text table, with a line saying what the
  interval is (wrapped to `width`; None: not wrapped)."""
  columns, cells = _seed_cells(rows)
  return "\n".join(_aligned(cells, columns) + _wrapped([_SEED_NOTE], width))


def format_seed_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
  """The rows of `compare_seeds` as a Markdown table and the interval's note."""
  columns, cells = _seed_cells(rows)
  lines = ["| " + " | ".join(c[1] for c in columns) + " |",
           "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(cells[c][i] for c in columns) + " |" for i in range(len(rows))]
  return "\n".join([*lines, "", _SEED_NOTE])


def _cell(value: Any, kind: str) -> str:
  if value is None:
    return "n/a" if kind == "ratio" else "-"
  return {"accuracy": lambda v: f"{v:.4f}", "bits": format_bits,
          "ratio": lambda v: f"{v:.2f}x", "epsilon": lambda v: f"{v:.4g}",
          "round": lambda v: str(int(v)),
          "hours": lambda v: f"{v / 3600:.4g}"}.get(kind, str)(value)
