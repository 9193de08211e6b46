"""`fedsim status` reads what happened to runs from their directories alone."""

from __future__ import annotations

import os

import numpy as np
import pytest
import yaml

from fedsim import cli
from fedsim.run_status import run_status
from fedsim.state import checkpoint as ckpt


def _run_dir(root, name, status, rounds_logged, checkpoint=None, rounds=5, message=""):
  run_dir = root / "exp" / name
  run_dir.mkdir(parents=True)
  (run_dir / "config.yaml").write_text(yaml.safe_dump({"name": "exp", "rounds": rounds}))
  if status:
    (run_dir / "status").write_text(f"{status}\n{message}\n" if message else f"{status}\n")
  if rounds_logged:
    lines = ["round,train/loss"] + [f"{r},0.5" for r in range(1, rounds_logged + 1)]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
  if checkpoint:
    ckpt.save_checkpoint(run_dir, checkpoint, [np.zeros(2)], 0.0, [1] * checkpoint,
                         [1] * checkpoint, keep=1)
  return run_dir


def test_one_line_per_run_with_status_round_checkpoint_and_reason(tmp_path, capsys):
  done = _run_dir(tmp_path, "a", "completed", 5, checkpoint=5)
  failed = _run_dir(tmp_path, "b", "failed", 3, checkpoint=2,
                    message="round 4: training diverged (train/loss = nan)")
  never = _run_dir(tmp_path, "c", "", 0)
  assert cli.main(["status", str(tmp_path)]) == 0
  assert capsys.readouterr().out.splitlines() == [
      f"{done}: completed, round 5 of 5",
      f"{failed}: failed, round 3 of 5, checkpoint at round 2: round 4: training diverged"
      " (train/loss = nan)",
      f"{never}: not started, round 0 of 5, no checkpoint",
  ]
  assert cli.main(["status", str(failed)]) == 0  # one run directory
  assert capsys.readouterr().out.count("\n") == 1


def test_a_running_run_says_how_long_it_has_been_silent(tmp_path):
  run_dir = _run_dir(tmp_path, "a", "running", 2, checkpoint=2)
  for name in ("metrics.csv", "status"):
    os.utime(run_dir / name, (1000.0, 1000.0))
  line = run_status(run_dir, now=1000.0 + 3 * 3600).line()
  assert line == f"{run_dir}: running, round 2 of 5, checkpoint at round 2, last write 3.0 h ago"


@pytest.mark.parametrize("make,message", [
    (lambda p: p / "missing", "{p}/missing: no such directory"),
    (lambda p: p, "{p}: no fedsim run directories (with config.yaml) here or below"),
])
def test_nothing_to_report_is_one_line_and_exit_2(tmp_path, capsys, make, message):
  assert cli.main(["status", str(make(tmp_path))]) == 2
  assert capsys.readouterr().err.splitlines() == [
      "fedsim: error: " + message.format(p=tmp_path)]


def test_a_damaged_run_is_listed_as_unreadable_and_the_others_still_are(tmp_path, capsys):
  good = _run_dir(tmp_path, "a", "completed", 5, checkpoint=5)
  broken_checkpoint = _run_dir(tmp_path, "b", "failed", 3, checkpoint=2)
  (progress,) = broken_checkpoint.glob("checkpoints/*/progress.json")
  progress.write_text("{not json")
  broken_status = _run_dir(tmp_path, "c", "running", 1)
  (broken_status / "status").write_bytes(b"\xff\xfe running\n")
  assert cli.main(["status", str(tmp_path)]) == 1
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == f"{good}: completed, round 5 of 5"
  # The rounds logged still count; the damaged checkpoint is named, not taken.
  assert lines[1].startswith(f"{broken_checkpoint}: failed, round 3 of 5, no checkpoint:"
                             " damaged checkpoint round_2/progress.json: ")
  assert lines[2].startswith(f"{broken_status}: unreadable, round 1 of 5, no checkpoint:"
                             f" {broken_status / 'status'}: unreadable status file (")
  assert len(lines) == 3


@pytest.mark.parametrize("text, why", [
    ("rounds: [5\n", "cannot read run config (ParserError)"),
    ("- 5\n", "not a fedsim run config (expected a mapping)"),
    ("name: exp\n", "no number of rounds (rounds: None)"),
])
def test_a_run_whose_config_is_damaged_says_why_and_is_not_offered_a_resume(
    tmp_path, capsys, text, why):
  run_dir = _run_dir(tmp_path, "a", "interrupted", 2, checkpoint=2, message="stopped by SIGTERM")
  (run_dir / "config.yaml").write_text(text)
  assert cli.main(["status", str(run_dir)]) == 1
  assert capsys.readouterr().out.splitlines() == [
      f"{run_dir}: interrupted, round 2, checkpoint at round 2: {run_dir / 'config.yaml'}:"
      f" {why}; stopped by SIGTERM"]
  assert not run_status(run_dir).resumable


@pytest.mark.parametrize("damage, why", [
    (lambda text: text + "\n", "metrics.csv:5: an empty line"),            # `echo >> metrics.csv`
    (lambda text: text.replace("1,0.5\n", "1,0.5\n\n"), "metrics.csv:3: an empty line"),
    (lambda text: text.replace("train/loss", "train/l\xe9ss").encode("latin-1"),
     "metrics.csv: a byte that is not UTF-8 at offset 13"),
    (lambda text: text[:-1], "metrics.csv: its last line is cut off (no newline ends it),"
                             " though the run completed"),
])
def test_a_hand_damaged_metrics_file_is_named_with_its_line_and_exits_1(
    tmp_path, capsys, damage, why):
  """It was a traceback (KeyError: 'round'), or a completed run silently one round short."""
  run_dir = _run_dir(tmp_path, "a", "completed", 3, checkpoint=3, rounds=3)
  metrics = run_dir / "metrics.csv"
  damaged = damage(metrics.read_text())
  (metrics.write_bytes if isinstance(damaged, bytes) else metrics.write_text)(damaged)
  assert cli.main(["status", str(tmp_path)]) == 1
  out = capsys.readouterr().out
  assert out == f"{run_dir}: completed, round 3 of 3: {run_dir / why}\n", out


def test_a_killed_runs_cut_off_last_line_is_what_the_kill_left_not_damage(tmp_path, capsys):
  run_dir = _run_dir(tmp_path, "a", "failed", 3, checkpoint=2, rounds=5,
                     message="no space left on device (writing metrics.csv)")
  metrics = run_dir / "metrics.csv"
  metrics.write_text(metrics.read_text()[:-1])   # a full disk cut the last row off
  assert cli.main(["status", str(run_dir)]) == 0
  assert capsys.readouterr().out == (
      f"{run_dir}: failed, round 2 of 5, checkpoint at round 2: no space left on device"
      " (writing metrics.csv)\n")
