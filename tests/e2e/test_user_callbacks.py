"""`fedsim.run(..., callbacks=[...])` end to end: a user callback sees every
round as logged, can stop the run (which then resumes from where it stopped),
and one that raises fails the run naming it."""

from __future__ import annotations

import numpy as np
import pytest

import fedsim
from fedsim.reporting import read_metrics_csv, read_status
from fedsim.state import checkpoint as ckpt

CONFIG = {
    "name": "callbacks", "seed": 3, "rounds": 5, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 6, "partition": "iid", "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg"},
    "eval": {"every": 2},
    "checkpoint": {"every": 2},
}


class _Seen(fedsim.Callback):
  """Records what each hook saw; stops after round `stop_after`, if given."""

  def __init__(self, stop_after=None):
    self.stop_after = stop_after
    self.starts, self.rounds, self.ends = [], [], []

  def on_start(self, run):
    self.starts.append((run.start, len(run.history)))

  def after_round(self, run, record):
    # Logged and checkpointed before a user callback sees the round.
    logged = read_metrics_csv(run.run_dir / "metrics.csv")[-1]
    checkpoint = ckpt.latest_checkpoint(run.run_dir)
    self.rounds.append((run.round_num, dict(record.metrics), logged,
                        checkpoint.round_num if checkpoint else 0))
    return run.round_num == self.stop_after

  def on_end(self, run):
    self.ends.append((run.round_num, read_status(run.run_dir)[0]))


class _Boom(fedsim.Callback):

  def after_round(self, run, record):
    if run.round_num == 2:
      raise ValueError("no metric 'x'\nsecond line")


@pytest.mark.slow
def test_a_callback_sees_each_round_logged_and_stops_a_run_that_resumes_from_there(
    tff_runtime, tmp_path):
  stopper, after = _Seen(stop_after=3), _Seen()
  result = fedsim.run(CONFIG, logdir=tmp_path, callbacks=[stopper, after])
  run_dir = result.run_dir
  # Every callback saw rounds 1-3 (the one after the stopper too), each row as logged.
  for seen in (stopper, after):
    assert [r for r, _, _, _ in seen.rounds] == [1, 2, 3]
    assert [metrics for _, metrics, _, _ in seen.rounds] == result.metrics
    for _, metrics, logged, _ in seen.rounds:
      assert logged == pytest.approx(metrics)
    assert [c for _, _, _, c in seen.rounds] == [0, 2, 2]  # checkpoint.every: 2
    assert seen.starts == [(0, 0)] and seen.ends == [(3, "running")]
  assert "eval/accuracy" in result.metrics[1] and "eval/accuracy" not in result.metrics[2]
  assert read_status(run_dir) == ("completed", "stopped after round 3 of 5 by _Seen")
  assert [r["round"] for r in read_metrics_csv(run_dir / "metrics.csv")] == [1, 2, 3]
  assert ckpt.latest_checkpoint(run_dir).round_num == 3  # the stop's round, off the cadence
  final = np.load(run_dir / "final_model.npz")
  for got, want in zip(final.values(), result.final_weights):
    np.testing.assert_array_equal(got, want)

  # Complete, so `resume=True` passes it over; named, it continues to `rounds`.
  later = _Seen()
  resumed = fedsim.run(CONFIG, logdir=tmp_path, resume=run_dir, callbacks=[later])
  assert resumed.run_dir == run_dir and read_status(run_dir) == ("completed", "")
  assert later.starts == [(3, 3)] and [r for r, _, _, _ in later.rounds] == [4, 5]
  assert [r["round"] for r in read_metrics_csv(run_dir / "metrics.csv")] == [1, 2, 3, 4, 5]
  straight = fedsim.run(CONFIG, logdir=tmp_path)
  for got, want in zip(resumed.final_weights, straight.final_weights):
    np.testing.assert_array_equal(got, want)
  assert resumed.metrics[-1]["eval/accuracy"] == straight.metrics[-1]["eval/accuracy"]


@pytest.mark.slow
def test_a_callback_that_raises_fails_the_run_naming_it_and_it_resumes(tff_runtime, tmp_path):
  line = "round 2: callback _Boom.after_round raised ValueError: no metric 'x'"
  with pytest.raises(fedsim.RunFailed) as raised:
    fedsim.run(CONFIG, logdir=tmp_path, callbacks=[_Boom()])
  assert str(raised.value) == line and isinstance(raised.value.__cause__, ValueError)
  (run_dir,) = (tmp_path / "callbacks").iterdir()
  assert read_status(run_dir) == ("failed", line)
  assert ckpt.latest_checkpoint(run_dir).round_num == 2  # checkpointed before the callback
  assert not (run_dir / "final_model.npz").exists()
  resumed = fedsim.run(CONFIG, logdir=tmp_path, resume=True)
  assert resumed.run_dir == run_dir and [r["round"] for r in resumed.metrics] == [1, 2, 3, 4, 5]
