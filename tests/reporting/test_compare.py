"""`fedsim compare`: the table, the ratios and the plot, from run directories on disk."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

from fedsim import cli
from fedsim.errors import UserError
from fedsim.reporting import CsvSink, write_config, write_status
from fedsim.reporting.compare import (compare_runs, draw_accuracy, format_comparison, load_runs,
                                      plot_accuracy_vs_bits)
from fedsim.reporting.rundir import PLOT_NAME, ROUNDS_PLOT_NAME

MLP = {"name": "mlp", "hidden": [4], "activation": "relu"}
FEDAVG = {"name": "fedavg"}
UNIFORM8 = {"broadcast": {"encoder": "uniform", "bits": 8, "min_elements": 10},
            "aggregation": {"encoder": "uniform", "bits": 8, "min_elements": 10}}
CLIENTS = 10


def _rows(per_client, accuracies):
  """metrics.csv rows of a run with fixed bits per client, CLIENTS clients a round."""
  broadcast, aggregate = per_client
  rows = []
  for round_num, accuracy in enumerate(accuracies, start=1):
    row = {"round": round_num, "train/loss": 1.0 / round_num,
           "broadcast_bits": broadcast * CLIENTS, "aggregate_bits": aggregate * CLIENTS,
           "cumulative_broadcast_bits": broadcast * CLIENTS * round_num,
           "cumulative_aggregate_bits": aggregate * CLIENTS * round_num,
           "broadcast_bits_per_client": broadcast, "aggregate_bits_per_client": aggregate}
    if accuracy is not None:
      row["eval/accuracy"] = accuracy
    rows.append(row)
  return rows


def _write_run(root, name, rows, *, compression=None, model=MLP, status="completed",
               message="", started=0):
  run_dir = root / name
  run_dir.mkdir(parents=True)
  config = {"name": root.name, "model": model, "algorithm": FEDAVG}
  if compression is not None:
    config["compression"] = compression
  write_config(run_dir, config)
  sink = CsvSink(run_dir / "metrics.csv")
  for row in rows:
    sink.write(row["round"], row)
  sink.close()
  if status:
    write_status(run_dir, status, message)
  # Runs are listed in the order they started: pin it rather than trust clock resolution.
  os.utime(run_dir / "config.yaml", ns=(started, 1_000_000_000 + started))
  return run_dir


@pytest.fixture
def experiment(tmp_path):
  """none (uncompressed), uniform8, a diverged run and a run still going; plus clutter."""
  root = tmp_path / "compare_encoders"
  _write_run(root, "none", _rows((1000, 1064), [0.5, 0.75]), started=1)
  _write_run(root, "uniform8", _rows((250, 400), [0.5, 0.7]), compression=UNIFORM8, started=2)
  _write_run(root, "diverged", _rows((250, 400), [None]), compression=UNIFORM8,
             status="failed", message="round 2: training diverged", started=3)
  _write_run(root, "going", _rows((1000, 1064), [0.25]), started=4, status="running")
  (root / "no-metrics").mkdir()
  write_config(root / "no-metrics", {"name": "x"})  # e.g. a run killed before round 1
  (root / "notes.txt").write_text("not a run")
  return root


def test_rows_hold_totals_accuracy_and_per_client_ratios(experiment):
  common = {"reference": "none", "privacy/epsilon": None,
            "broadcast_entropy_bits": None, "aggregate_entropy_bits": None}
  assert compare_runs(experiment) == [
      {"variant": "none", "status": "completed", "rounds": 2, "eval/accuracy": 0.75,
       "broadcast_bits": 20_000, "aggregate_bits": 21_280,
       "broadcast_ratio": 1.0, "aggregate_ratio": 1.0, **common},
      {"variant": "uniform8", "status": "completed", "rounds": 2, "eval/accuracy": 0.7,
       "broadcast_bits": 5_000, "aggregate_bits": 8_000,
       "broadcast_ratio": 4.0, "aggregate_ratio": 2.66, **common},
      # Per client, so a run cut short compares like one that finished.
      {"variant": "diverged", "status": "failed", "rounds": 1, "eval/accuracy": None,
       "broadcast_bits": 2_500, "aggregate_bits": 4_000,
       "broadcast_ratio": 4.0, "aggregate_ratio": 2.66, **common},
      {"variant": "going", "status": "running", "rounds": 1, "eval/accuracy": 0.25,
       "broadcast_bits": 10_000, "aggregate_bits": 10_640,
       "broadcast_ratio": 1.0, "aggregate_ratio": 1.0, **common},
  ]


def test_table_text(experiment):
  assert format_comparison(compare_runs(experiment)).splitlines() == [
      "variant   status     rounds  eval/accuracy   broadcast   aggregate"
      "  broadcast ratio  aggregate ratio",
      "none      completed  2              0.7500  19.5 Kibit  20.8 Kibit"
      "            1.00x            1.00x",
      "uniform8  completed  2              0.7000  4.88 Kibit  7.81 Kibit"
      "            4.00x            2.66x",
      "diverged  failed     1                   -  2.44 Kibit  3.91 Kibit"
      "            4.00x            2.66x",
      "going     running    1              0.2500  9.77 Kibit  10.4 Kibit"
      "            1.00x            1.00x",
      "ratio: bits per client of the uncompressed run (none) / this run's; higher sends less",
  ]


def test_without_an_uncompressed_run_of_the_same_model_ratios_are_not_invented(tmp_path):
  root = tmp_path / "exp"
  _write_run(root, "uniform8", _rows((250, 400), [0.5]), compression=UNIFORM8, started=1)
  # Uncompressed, but a different model: its bits say nothing about uniform8's.
  _write_run(root, "wide", _rows((9000, 9064), [0.5]), model={**MLP, "hidden": [64]},
             started=2)
  rows = compare_runs(root)
  assert [(r["variant"], r["broadcast_ratio"], r["aggregate_ratio"], r["reference"])
          for r in rows] == [("uniform8", None, None, None), ("wide", 1.0, 1.0, "wide")]
  text = format_comparison(rows[:1])
  assert text.splitlines()[1].endswith("n/a              n/a")
  assert text.splitlines()[-1] == (
      "ratio: n/a, no uncompressed run of the same model in this experiment")


@pytest.mark.parametrize("compression", [
    {}, {"broadcast": {"encoder": "identity", "min_elements": 10000}},
])
def test_empty_or_identity_compression_is_a_reference(tmp_path, compression):
  root = tmp_path / "exp"
  _write_run(root, "plain", _rows((1000, 1064), [0.5]), compression=compression, started=1)
  _write_run(root, "uniform8", _rows((500, 532), [0.5]), compression=UNIFORM8, started=2)
  assert [(r["reference"], r["broadcast_ratio"], r["aggregate_ratio"])
          for r in compare_runs(root)] == [("plain", 1.0, 1.0), ("plain", 2.0, 2.0)]


def test_a_majority_vote_run_is_compressed_not_a_reference(tmp_path):
  root = tmp_path / "exp"
  path = _write_run(root, "vote", _rows((1000, 34), [0.5]), started=1)
  write_config(path, {"name": "exp", "model": MLP, "algorithm": FEDAVG,
                      "aggregation": [{"name": "majority_vote", "step": 1.0}]})
  os.utime(path / "config.yaml", ns=(1, 1_000_000_001))
  _write_run(root, "plain", _rows((1000, 1064), [0.5]), started=2)
  assert [(r["variant"], r["reference"], r["aggregate_ratio"]) for r in compare_runs(root)] == [
      ("vote", "plain", 1064 / 34), ("plain", "plain", 1.0)]


def test_runs_are_listed_in_the_order_they_started(tmp_path):
  root = tmp_path / "exp"
  for name, started in [("b", 1), ("c", 2), ("a", 3)]:
    _write_run(root, name, _rows((8, 8), [0.5]), started=started)
  assert [run.name for run in load_runs(root)] == ["b", "c", "a"]


def test_plot_is_a_png_in_the_experiment_dir(experiment):
  runs = {run.name: run for run in load_runs(experiment)}
  # broadcast + aggregate: (250 + 400) bits x 10 clients a round.
  assert runs["uniform8"].accuracy_vs_bits() == ([6_500, 13_000], [0.5, 0.7])
  assert runs["diverged"].accuracy_vs_bits() == ([], [])
  path = plot_accuracy_vs_bits(experiment)
  assert path == experiment / PLOT_NAME
  data = path.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
  assert struct.unpack(">II", data[16:24]) == (700, 450)  # 7 x 4.5 in at 100 dpi


@pytest.mark.parametrize("make, message", [
    (lambda root: root / "missing", "{path}: no such directory"),
    (lambda root: root / "none" / "metrics.csv",
     "{path}: not a directory (expected an experiment directory such as runs/<name>)"),
    (lambda root: root / "none",
     "{path}: is a single run; pass its experiment directory {path.parent}"),
    (lambda root: root / "no-metrics",
     "{path}: no run directories (with metrics.csv and config.yaml) in it"),
])
def test_bad_paths_name_the_path(experiment, make, message):
  path = make(experiment)
  with pytest.raises(UserError) as e:
    compare_runs(path)
  assert str(e.value) == message.format(path=path)


def test_a_broken_run_file_names_the_file(experiment):
  (experiment / "uniform8" / "config.yaml").write_text("- just\n- a list\n")
  with pytest.raises(UserError, match=r"uniform8/config.yaml: not a fedsim run config"):
    compare_runs(experiment)


def test_cli_prints_the_table_and_the_plot_path(experiment, capsys):
  assert cli.main(["compare", str(experiment)]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith("variant   status")
  assert out[-1] == f"plot: {experiment / PLOT_NAME}"
  assert (experiment / PLOT_NAME).is_file()


def test_a_plot_that_cannot_be_written_is_the_machines_error_as_a_table_is(experiment, capsys):
  """Exit 1 and the path, as for the seed table's files (a read-only or full
  disk is not bad input; it was exit 2 for the plot)."""
  (experiment / ROUNDS_PLOT_NAME).mkdir()   # where the figure goes
  assert cli.main(["compare", str(experiment)]) == 1
  assert capsys.readouterr().err == (
      f"fedsim: error: is a directory (writing {experiment / ROUNDS_PLOT_NAME})\n")


@pytest.mark.parametrize("damage, why", [
    (lambda text: text + "\n", ":4: an empty line"),
    (lambda text: text.replace("\n", "\n\n", 1), ":2: an empty line"),
    (lambda text: text.replace("round", "r\xf6und", 1).encode("latin-1"),
     ": a byte that is not UTF-8 at offset 1"),
    (lambda text: text[:-1], ": its last line is cut off (no newline ends it), though the run"
                             " completed"),
])
def test_a_hand_damaged_metrics_file_is_named_not_counted(experiment, capsys, damage, why):
  """An empty line counted as a round and a stray byte was a traceback; a completed
  run's last row cut off read as one round fewer."""
  metrics = experiment / "uniform8" / "metrics.csv"
  damaged = damage(metrics.read_text())
  (metrics.write_bytes if isinstance(damaged, bytes) else metrics.write_text)(damaged)
  assert cli.main(["compare", str(experiment)]) == 2
  captured = capsys.readouterr()
  assert (captured.out, captured.err) == ("", f"fedsim: error: {metrics}{why}\n")


def test_cli_bad_path_exits_2_with_one_line(tmp_path):
  missing = tmp_path / "runs" / "nope"
  result = subprocess.run([sys.executable, "-m", "fedsim.cli", "compare", str(missing)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 2
  assert result.stdout == ""
  assert result.stderr == f"fedsim: error: {missing}: no such directory\n"


def test_differentially_private_runs_add_an_epsilon_column(tmp_path):
  root = tmp_path / "dp"
  _write_run(root, "plain", _rows((1000, 1000), [0.9]), started=1)
  private = _rows((1000, 1000), [0.5, 0.7])
  for row, epsilon in zip(private, (3.25, 4.5)):
    row["privacy/epsilon"] = epsilon
  _write_run(root, "noised", private, started=2)
  rows = compare_runs(root)
  assert [row["privacy/epsilon"] for row in rows] == [None, 4.5]
  header, plain, noised = format_comparison(rows).splitlines()[:3]
  assert header.split()[-1] == "epsilon"
  assert plain.split()[-1] == "-" and noised.split()[-1] == "4.5"
  _write_run(tmp_path / "no_dp", "x", _rows((1, 1), [0.1]))
  assert "epsilon" not in format_comparison(compare_runs(tmp_path / "no_dp"))


def test_target_columns_say_where_each_run_first_reached_the_accuracy(tmp_path):
  root = tmp_path / "target"
  fast = _rows((1000, 1000), [0.5, 0.92, 0.85, 0.95])
  for i, row in enumerate(fast, start=1):
    row["simulated_seconds"] = 1800.0 * i
  _write_run(root, "fast", fast, started=1)
  _write_run(root, "never", _rows((1000, 1000), [0.5, 0.6]), started=2)
  fast_row, never_row = compare_runs(root, target=0.9)
  # Round 2 is the first at >= 0.9: 2 rounds x 10 clients x 1000 bits, each way.
  assert (fast_row["target_round"], fast_row["target_bits"], fast_row["target_seconds"]) == (
      2, 40_000, 3600.0)
  assert never_row["target_round"] is None and never_row["target_bits"] is None
  header, line, missing = format_comparison([fast_row, never_row], None).splitlines()[:3]
  assert header.endswith("round to target  bits to target  sim. hours to target")
  assert line.split()[-4:] == ["2", "39.1", "Kibit", "1"]
  assert missing.split()[-3:] == ["-", "-", "-"]
  assert "target" not in format_comparison(compare_runs(root))


def test_budget_columns_hold_the_best_accuracy_evaluated_within_the_budget(tmp_path):
  root = tmp_path / "budget"
  # 20,000 bits a round both ways: rounds 1-3 fit in 64 Kibit (65,536), round 4 does not.
  _write_run(root, "dense", _rows((1000, 1000), [0.5, 0.92, 0.85, 0.95]), started=1)
  # 4,000 bits a round: all 6 rounds fit; the best (0.9) first at round 5.
  _write_run(root, "sparse", _rows((200, 200), [0.3, 0.4, None, 0.8, 0.9, 0.9]), started=2)
  # 100,000 bits a round: its one evaluation is past the budget.
  _write_run(root, "huge", _rows((5000, 5000), [0.99]), started=3)
  rows = compare_runs(root, budget=65_536)
  assert [(r["budget_accuracy"], r["budget_round"]) for r in rows] == [
      (0.92, 2), (0.9, 5), (None, None)]
  header, dense, sparse, huge = format_comparison(rows, None).splitlines()[:4]
  assert header.endswith("best acc. within 64 Kibit  at round")
  assert dense.split()[-2:] == ["0.9200", "2"]
  assert sparse.split()[-2:] == ["0.9000", "5"]
  assert huge.split()[-2:] == ["-", "-"]
  assert "budget" not in format_comparison(compare_runs(root))


def test_entropy_columns_appear_when_a_run_recorded_entropy_bits(tmp_path):
  root = tmp_path / "entropy"
  per_round = _rows((1000, 1000), [0.5, 0.6, 0.7])
  for i, row in enumerate(per_round):
    row["broadcast_entropy_bits"], row["aggregate_entropy_bits"] = 700 + i, 300
  _write_run(root, "per_round", per_round, started=1)
  cumulative = _rows((1000, 1000), [0.5, 0.6])
  for i, row in enumerate(cumulative, start=1):
    row["cumulative_broadcast_entropy_bits"] = 4096 * i
    row["cumulative_aggregate_entropy_bits"] = 1024 * i
    row["broadcast_entropy_bits"] = row["aggregate_entropy_bits"] = 1.0  # totals win
  _write_run(root, "cumulative", cumulative, started=2)
  _write_run(root, "raw_only", _rows((1000, 1000), [0.5]), started=3)
  rows = compare_runs(root)
  assert [(r["broadcast_entropy_bits"], r["aggregate_entropy_bits"]) for r in rows] == [
      (2103, 900), (8192, 2048), (None, None)]
  header, first, second, third = format_comparison(rows, None).splitlines()[:4]
  assert "aggregate  broadcast entropy  aggregate entropy  broadcast ratio" in header
  assert "2.05 Kibit" in first and "900 bit" in first
  assert "8.00 Kibit" in second and "2.00 Kibit" in second
  assert third.split()[8:10] == ["-", "-"]
  assert "entropy" not in format_comparison(rows[2:])


def _powers_of_two_run(root, name, started, accuracy_offset=0.0):
  """One run whose evaluations sit at 2**26 .. 2**30 cumulative bits (64 Mibit .. 1 Gibit)."""
  rows = []
  for i in range(5):
    bits = 2**(26 + i)
    rows.append({"round": i + 1, "train/loss": 1.0, "eval/accuracy": 0.5 + accuracy_offset,
                 "cumulative_broadcast_bits": bits // 2, "cumulative_aggregate_bits": bits // 2})
  return _write_run(root, name, rows, started=started)


def test_bit_axis_ticks_share_one_unit_and_decimals(tmp_path):
  root = tmp_path / "ticks"
  _powers_of_two_run(root, "a", 1)
  axes = draw_accuracy(root, "bits").axes[0]
  low, high = axes.get_xlim()
  labels = [t.get_text() for t in axes.get_xticklabels() if low <= t.get_position()[0] <= high]
  assert labels == ["64 Mibit", "128 Mibit", "256 Mibit", "512 Mibit", "1024 Mibit"]


def test_overlapping_curves_differ_in_marker_and_line_style(tmp_path):
  root = tmp_path / "overlap"
  for i in range(5):   # identical curves: only markers and styles tell them apart
    _powers_of_two_run(root, f"run{i}", i + 1)
  lines = draw_accuracy(root, "rounds").axes[0].get_lines()
  styles = [(line.get_marker(), line.get_linestyle()) for line in lines]
  assert len(styles) == 5 and len(set(styles)) == 5
  assert len({marker for marker, _ in styles}) == 5


def test_cli_budget_and_a_bad_budget(experiment, capsys):
  assert cli.main(["compare", "--budget", "8Kibit", str(experiment)]) == 0
  out = capsys.readouterr().out.splitlines()
  # The table is wider than 120 columns: the budget's two columns wrap into a block.
  assert any(line.endswith("best acc. within 8 Kibit  at round") for line in out)
  assert max(len(line) for line in out if not line.startswith("plot: ")) <= 120
  assert cli.main(["compare", "--budget", "lots", str(experiment)]) == 2
  assert capsys.readouterr().err == (
      "fedsim: error: --budget: expected a positive number of bits such as 5e6 or 64Mibit,"
      " got 'lots'\n")


def test_the_table_fits_120_columns_unless_wide(tmp_path, capsys):
  root = tmp_path / "wide"
  names = ["uncompressed_float32_baseline", "uniform_8_bits_stochastic_rounding_seed_12"]
  for i, name in enumerate(names):
    rows = _rows((1000, 1000 // (i + 1)), [0.5, 0.92])
    for row in rows:
      row.update({"broadcast_entropy_bits": 900, "aggregate_entropy_bits": 400,
                  "privacy/epsilon": 2.5, "simulated_seconds": 3600.0})
    _write_run(root, name, rows, compression=UNIFORM8 if i else None, started=i,
               status="completed" if i else "interrupted")
  rows = compare_runs(root, target=0.9, budget=65_536)
  wide = format_comparison(rows, width=None)
  assert len(wide.splitlines()[0]) > 120 and "broadcast entropy" in wide.splitlines()[0]
  text = format_comparison(rows)
  assert max(map(len, text.splitlines())) <= 120
  assert "entropy" not in text.split("\n\n")[0] + text.split("\n\n")[1].split("ratio:")[0]
  assert text.splitlines()[-1].endswith("fedsim compare --wide shows every column")
  # Every column but the entropy totals, in blocks that each start with the variant.
  blocks = text.split("\n\n")
  assert len(blocks) >= 2 and all(b.startswith("variant ") for b in blocks)
  titles = " ".join(b.splitlines()[0] for b in blocks)
  for title in ("status", "eval/accuracy", "broadcast ratio", "aggregate ratio", "epsilon",
                "round to target", "sim. hours to target", "best acc. within 64 Kibit",
                "at round"):
    assert title in titles
  for block in blocks:
    assert [line.split()[0] for line in block.splitlines()[1:3]] == names
  assert cli.main(["compare", str(root), "--target", "0.9", "--wide"]) == 0
  assert "broadcast entropy" in capsys.readouterr().out


def test_a_sweep_of_many_variants_keeps_its_legend_off_the_curves(tmp_path):
  """40 curves: the legend inside the axes hid them, and taller than the figure
  it left no room for the axes (matplotlib warned that its tight layout was not
  applied). It now stands right of the axes in columns; a few curves keep it inside."""
  import warnings
  root = tmp_path / "sweep"
  for i in range(40):
    _powers_of_two_run(root, f"uniform{i}-with-a-long-variant-name", i + 1, accuracy_offset=i / 100)
  with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)  # matplotlib's "Tight layout not applied"
    figure = draw_accuracy(root, "bits")
  axes = figure.axes[0]
  renderer = figure.canvas.get_renderer()
  legend = axes.get_legend().get_window_extent(renderer)
  plot = axes.get_window_extent(renderer)
  assert len(axes.get_legend().get_texts()) == 40
  assert legend.x0 > plot.x1   # beside the axes, not over the curves
  assert figure.bbox.x0 <= legend.x0 and legend.x1 <= figure.bbox.x1   # whole, on the figure
  assert plot.width > 0.5 * 700   # the axes keep at least half the original 7 in
  _powers_of_two_run(tmp_path / "few", "a", 1)
  few = draw_accuracy(tmp_path / "few", "bits")
  renderer = few.canvas.get_renderer()
  inside = few.axes[0].get_legend().get_window_extent(renderer)
  assert few.axes[0].get_window_extent(renderer).contains(inside.x0 + 1, inside.y0 + 1)
  assert tuple(few.get_size_inches()) == (7.0, 4.5)
