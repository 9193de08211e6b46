from __future__ import annotations

import pytest

from fedsim.reporting.progress import Progress


def _run(progress):
  progress.update(1, {"train/loss": 1.0})
  progress.update(2, {"train/loss": 0.5, "eval/accuracy": 0.8125})
  progress.update(3, {"train/loss": 0.25})
  progress.close()


@pytest.mark.parametrize("enabled", [False, None])  # None: captured stdout is no terminal.
def test_quiet_when_disabled(capsys, enabled):
  _run(Progress(3, enabled=enabled))
  assert capsys.readouterr() == ("", "")


def test_shows_rounds_and_last_eval_accuracy(capsys):
  _run(Progress(5, enabled=True, start_round=0))
  out, err = capsys.readouterr()
  assert err == ""
  final = out.rstrip("\n").split("\r")[-1]
  assert "3/5" in final
  assert "eval acc 0.8125" in final  # Round 3 had no eval: the last known value stays.


def test_resumed_run_starts_at_start_round(capsys):
  progress = Progress(10, enabled=True, start_round=6)
  progress.update(7, {})
  progress.close()
  out, _ = capsys.readouterr()
  assert "7/10" in out.split("\r")[-1]
  assert "eval acc" not in out
