"""bench/peers/: the side-by-side's own pieces (the peers themselves need their venv)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

PEERS = pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers"
sys.path.insert(0, str(PEERS))

import fedsim_run  # noqa: E402
import protocol  # noqa: E402
import shared_workloads as sw  # noqa: E402
import side_by_side  # noqa: E402


def test_users_are_seeded_by_index_alone_and_learnable():
  w = sw.WORKLOADS["P1"]
  x, y = sw.user_data(w, 7)
  assert x.shape == (50, 32, 32, 3) and x.dtype == np.float32 and y.dtype == np.int64
  again, _ = sw.user_data(w, 7)
  np.testing.assert_array_equal(x, again)
  assert not np.array_equal(x, sw.user_data(w, 8)[0])
  # Labels are a fixed linear map's argmax: a reference computed here from the seed.
  teacher = np.random.default_rng([sw.SEED, w.users]).standard_normal((3072, 10),
                                                                      dtype=np.float32)
  np.testing.assert_array_equal(y, np.argmax(x.reshape(50, -1) @ teacher, axis=1))


def test_fedsim_config_validates_as_a_user_config():
  import fedsim
  for name in sw.WORKLOADS:
    assert fedsim.validate(fedsim_run.config(sw.WORKLOADS[name], rounds=3))


def test_fedsim_data_builder_gives_every_user():
  data = fedsim_run.load(seed=5, workload="W2")
  assert sorted(data["clients"]) == [f"u{u:04d}" for u in range(10)]
  x, y = data["clients"]["u0003"]
  np.testing.assert_array_equal(x, sw.user_data(sw.WORKLOADS["W2"], 3)[0])
  assert y.dtype == np.int32


def test_protocol_lines_round_trip_and_others_are_ignored():
  assert protocol.parse(protocol.MARK + '{"round": 2, "t": 1.5}') == {"round": 2, "t": 1.5}
  assert protocol.parse("INFO: a library's log line") is None


def _run(records, exit_code=0, extra=None):
  return {"framework": "fedsim", "launched": 100.0, "records": records,
          "extra": extra or {}, "exit": exit_code, "load": 1.0}


def test_summary_times_rounds_after_warmup_from_their_ends():
  recs = [{"round": r, "t": t, "loss": l, "round_seconds": s} for r, t, l, s in
          [(1, 110.0, 2.0, 5.0), (2, 110.5, 1.9, 0.4), (3, 110.75, 1.8, 0.2),
           (4, 111.0, 1.5, 0.1)]]
  s = side_by_side.summarize(_run(recs), rounds=4, warmup=2)
  assert s["ms"] == [250.0, 250.0]
  assert s["startup_s"] == 10.0
  assert s["loss"] == (2.0, 1.5) and s["loss_falls"]
  assert s["own_ms"] == [200.0, 100.0]


@pytest.mark.parametrize("after,falls", [(2.4, False), (float("nan"), False), (2.2, True)])
def test_summary_uses_before_after_loss_when_given(after, falls):
  recs = [{"round": r, "t": 100.0 + r, "loss": None} for r in (1, 2, 3)]
  s = side_by_side.summarize(_run(recs, extra={"loss_before": 2.3, "loss_after": after}),
                             rounds=3, warmup=1)
  assert s["ms"] == [1000.0, 1000.0] and s["loss_falls"] is falls


@pytest.mark.parametrize("exit_code,recs,error", [
    (None, [{"round": 1, "t": 101.0, "loss": 2.0}], "timed out, 1 of 3 rounds"),
    (1, [], "exit 1, 0 of 3 rounds"),
    (0, [{"round": r, "t": 100.0 + r, "loss": 2.0 - r, "failures": r % 2} for r in (1, 2, 3)],
     "2 client update(s) failed"),
])
def test_summary_reports_a_failed_run(exit_code, recs, error):
  assert side_by_side.summarize(_run(recs, exit_code), rounds=3, warmup=1)["error"] == error


def test_end_processes_ends_what_a_run_started_and_only_that():
  tag = f"test-{os.getpid()}"
  env = dict(os.environ, **{side_by_side.TAG: tag})
  # A child that starts a grandchild in its own session, as Ray's daemons are.
  proc = subprocess.Popen([sys.executable, "-c",
                           "import subprocess, sys, time; subprocess.Popen([sys.executable,"
                           " '-c', 'import time; time.sleep(60)'], start_new_session=True);"
                           " time.sleep(60)"], env=env)
  bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    for _ in range(50):
      if len(side_by_side.tagged_processes(tag)) == 2:
        break
      time.sleep(0.1)
    assert len(side_by_side.tagged_processes(tag)) == 2
    assert side_by_side.end_processes(tag) == 0
    assert side_by_side.tagged_processes(tag) == []
    assert bystander.poll() is None
  finally:
    proc.kill()
    bystander.kill()
    proc.wait()
    bystander.wait()
