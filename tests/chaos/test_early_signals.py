"""A signal after the run directory exists but before the run loop writes its
status (while the TFF worker starts) leaves the run `interrupted`, not without
a status (`fedsim status` said `unknown, round 0`; seen by bench/signal_trials.py)."""

from __future__ import annotations

import contextlib

import pytest

import fedsim
from fedsim.reporting.rundir import mark_interrupted, read_status, write_status

CONFIG = {"name": "early", "seed": 1, "rounds": 2, "clients_per_round": 2,
          "data": {"name": "digits", "num_clients": 4, "partition": "iid", "batch_size": 32},
          "model": {"name": "logistic"}, "algorithm": {"name": "fedavg"},
          "runtime": {"name": "inprocess", "device": "cpu"}}


@pytest.mark.parametrize("signal_error", [KeyboardInterrupt(), SystemExit(143)],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_worker_starts_leaves_the_run_interrupted(
    tff_runtime, tmp_path, monkeypatch, signal_error):
  from fedsim.runtime import session as sessions

  @contextlib.contextmanager
  def interrupted_start(*args, **kwargs):
    raise signal_error  # as fedsim.runtime.signals raises it in the main thread
    yield  # pylint: disable=unreachable

  monkeypatch.setattr(sessions, "session", interrupted_start)
  with pytest.raises(type(signal_error)):
    fedsim.run(CONFIG, logdir=tmp_path, progress=False)
  (run_dir,) = (tmp_path / "early").iterdir()
  assert read_status(run_dir)[0] == "interrupted"


@pytest.mark.parametrize("before, after", [("", "interrupted"), ("running", "interrupted"),
                                           ("completed", "completed"), ("failed", "failed")])
def test_mark_interrupted_leaves_a_status_the_loop_wrote(tmp_path, before, after):
  if before:
    write_status(tmp_path, before)
  mark_interrupted(tmp_path)
  assert read_status(tmp_path)[0] == after
