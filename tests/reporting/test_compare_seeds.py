"""`fedsim compare` over seeds: mean and 95% t-interval per variant, and the bands' curves."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from scipy import stats

from fedsim import cli
from fedsim.reporting import CsvSink, write_config, write_status
from fedsim.reporting.compare import compare_seeds, format_seed_comparison, load_runs
from fedsim.reporting.rundir import PLOT_NAME, ROUNDS_PLOT_NAME
from fedsim.reporting.seed_groups import curve, group_by_seed

UNIFORM8 = {"aggregation": {"encoder": "uniform", "bits": 8}}
# Per seed: eval accuracy after rounds 1 and 2.
PLAIN = {0: [0.50, 0.71], 1: [0.55, 0.74], 2: [0.42, 0.69]}
QUANTIZED = {0: [0.40, 0.60], 1: [0.52, 0.66], 2: [0.47, 0.70]}


def _write(root, name, seed, accuracies, per_client_bits, compression=None, status="completed",
           seeds=(0, 1, 2)):
  run_dir = root / name
  run_dir.mkdir(parents=True)
  config = {"name": root.name, "seed": seed, "seeds": list(seeds),
            "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"}}
  if compression is not None:
    config["compression"] = compression
  write_config(run_dir, config)
  sink = CsvSink(run_dir / "metrics.csv")
  for r, accuracy in enumerate(accuracies, start=1):
    sink.write(r, {"round": r, "eval/accuracy": accuracy,
                   "cumulative_broadcast_bits": 1000 * r,
                   "cumulative_aggregate_bits": per_client_bits * r})
  sink.close()
  write_status(run_dir, status)


@pytest.fixture
def experiment(tmp_path):
  root = tmp_path / "seeded"
  for seed in PLAIN:
    _write(root, f"plain-seed{seed}", seed, PLAIN[seed], 1000)
  for seed in QUANTIZED:  # a lossy encoder's bits may differ per seed
    _write(root, f"uniform8-seed{seed}", seed, QUANTIZED[seed], 200 + 10 * seed, UNIFORM8)
  return root


def _t_interval(values):
  values = np.asarray(values, float)
  low, high = stats.t.interval(0.95, len(values) - 1, loc=values.mean(),
                               scale=stats.sem(values))
  return values.mean(), (high - low) / 2


def test_each_variant_reports_mean_and_95_percent_t_interval_over_seeds(experiment):
  rows = {row["variant"]: row for row in compare_seeds(experiment)}
  assert list(rows) == ["plain", "uniform8"]
  for name, per_seed, bits in (("plain", PLAIN, [4000, 4000, 4000]),
                               ("uniform8", QUANTIZED, [2400, 2420, 2440])):
    row = rows[name]
    assert row["seeds"] == [0, 1, 2]
    assert row["runs"] == [f"{name}-seed{s}" for s in (0, 1, 2)]
    mean, half = _t_interval([per_seed[s][-1] for s in (0, 1, 2)])
    assert row["eval/accuracy"] == pytest.approx(mean, abs=1e-12)
    assert row["eval/accuracy_interval"] == pytest.approx(half, rel=1e-9)
    assert row["bits"] == pytest.approx(np.mean(bits))
  assert rows["plain"]["bits_interval"] is None  # every seed sent the same bits
  assert rows["uniform8"]["bits_interval"] == pytest.approx(_t_interval([2400, 2420, 2440])[1])
  # Two rounds each: per round, the plain seeds 2000 bits, the uniform8 ones 1200-1220.
  assert rows["plain"]["bits_per_round"] == 2000 and rows["plain"]["bits_per_round_interval"] is None
  assert rows["uniform8"]["bits_per_round"] == pytest.approx(1210)
  assert rows["uniform8"]["bits_per_round_interval"] == pytest.approx(
      _t_interval([1200, 1210, 1220])[1])
  text = format_seed_comparison(compare_seeds(experiment))
  mean, half = _t_interval([0.71, 0.74, 0.69])
  assert f"{mean:.4f} +- {half:.4f}" in text
  assert "t(0.975, n-1) * s / sqrt(n)" in text.splitlines()[-1]


def test_the_seed_table_is_written_as_markdown_and_csv(experiment):
  from fedsim.reporting.compare import write_seed_table
  md, csv_path = write_seed_table(experiment, compare_seeds(experiment))
  assert (md.name, csv_path.name) == ("study_result.md", "study_result.csv")
  lines = md.read_text().splitlines()
  assert lines[0] == ("| variant | seeds | eval/accuracy (mean +- 95%) | bits (mean +- 95%) |"
                      " bits per round (mean +- 95%) |")
  mean, half = _t_interval([0.71, 0.74, 0.69])
  assert lines[2].startswith(f"| plain | 0,1,2 | {mean:.4f} +- {half:.4f} | ")
  with open(csv_path, newline="") as f:
    rows = {row["variant"]: row for row in csv.DictReader(f)}
  assert rows["plain"]["seeds"] == "0 1 2" and rows["plain"]["bits_interval"] == ""
  assert float(rows["uniform8"]["bits_per_round"]) == pytest.approx(1210)
  assert float(rows["plain"]["eval/accuracy_interval"]) == pytest.approx(half, rel=1e-12)


def test_band_curves_are_mean_and_interval_per_round(experiment):
  groups = {g.label: g for g in group_by_seed(load_runs(experiment))}
  rounds, mean, half = curve(groups["uniform8"], "rounds")
  np.testing.assert_array_equal(rounds, [1, 2])
  for i in range(2):
    want_mean, want_half = _t_interval([QUANTIZED[s][i] for s in (0, 1, 2)])
    assert mean[i] == pytest.approx(want_mean) and half[i] == pytest.approx(want_half)
  bits, _, _ = curve(groups["uniform8"], "bits")
  # Broadcast 1000 a round; the seeds aggregate 200, 210 and 220 a round.
  np.testing.assert_allclose(bits, [1000 + 210, 2 * (1000 + 210)])


def test_seeds_run_by_a_later_command_join_the_variant(tmp_path):
  """`--seeds 0` then `--seeds 1,2`: one variant of three seeds, not two groups."""
  root = tmp_path / "later"
  _write(root, "plain-seed0", 0, PLAIN[0], 1000, seeds=(0,))
  for seed in (1, 2):
    _write(root, f"plain-seed{seed}", seed, PLAIN[seed], 1000, seeds=(1, 2))
  (row,) = compare_seeds(root)
  assert row["variant"] == "plain" and list(row["seeds"]) == [0, 1, 2]


def test_rerun_of_a_seed_keeps_the_completed_run_and_lists_the_other(experiment):
  _write(experiment, "plain-seed1-1", 1, [0.1], 1000, status="failed")
  groups = group_by_seed(load_runs(experiment))
  names = [[run.name for run in g.runs] for g in groups]
  assert ["plain-seed0", "plain-seed1", "plain-seed2"] in names
  assert ["plain-seed1-1"] in names


def test_cli_prints_the_seed_table_and_both_plots(experiment, capsys):
  assert cli.main(["compare", str(experiment)]) == 0
  out = capsys.readouterr().out.splitlines()
  assert any(line.startswith("variant   seeds") for line in out)
  assert out[-2:] == [f"plot: {experiment / ROUNDS_PLOT_NAME}", f"plot: {experiment / PLOT_NAME}"]
  for name in (PLOT_NAME, ROUNDS_PLOT_NAME):
    assert (experiment / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
