"""Checkpoint files: atomic writes, pruning, client-state snapshots, rewinding logs."""

from __future__ import annotations

import collections
import errno
import os
import time

import numpy as np
import pytest

from fedsim.errors import HostError, UserError
from fedsim.state import checkpoint as ckpt
from fedsim.state import durable
from fedsim.state.client_states import ClientStateStore
from fedsim.state.rewind import rewind_logs, rewrite_event_file
from tests.resume.events import steps_by_tag


def _state(value: float):
  return collections.OrderedDict(
      model=(np.full((2, 3), value, np.float32), np.arange(3, dtype=np.float32)),
      aggregator=collections.OrderedDict(count=np.int64(7), empty=()),
      finalizer=collections.OrderedDict(learning_rate=np.float32(value)))


def _save(run_dir, round_num, value=1.0, keep=3, client_states=None):
  return ckpt.save_checkpoint(run_dir, round_num, _state(value), 1.5 * round_num,
                              [10] * round_num, [20] * round_num, keep, client_states)


def test_round_trip_is_bit_exact(tmp_path):
  _save(tmp_path, 2, value=0.1)
  latest = ckpt.latest_checkpoint(tmp_path)
  assert (latest.round_num, latest.simulated_seconds) == (2, 3.0)
  assert latest.broadcast_history == (10, 10) and latest.aggregate_history == (20, 20)
  restored = latest.server_state(_state(0.0))
  assert list(restored) == ["model", "aggregator", "finalizer"]
  np.testing.assert_array_equal(restored["model"][0], np.full((2, 3), 0.1, np.float32))
  assert restored["model"][0].dtype == np.float32
  assert restored["aggregator"]["count"] == 7 and restored["aggregator"]["empty"] == ()
  assert restored["finalizer"]["learning_rate"] == np.float32(0.1)


def test_keeps_the_newest_and_ignores_incomplete(tmp_path):
  for r in (2, 4, 6):
    _save(tmp_path, r, keep=2)
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["round_4", "round_6"]
  os.remove(tmp_path / "checkpoints/round_6/COMPLETE")  # as if killed before the marker
  assert ckpt.latest_checkpoint(tmp_path).round_num == 4
  assert ckpt.latest_checkpoint(tmp_path / "nowhere") is None


def test_failed_write_leaves_no_checkpoint(tmp_path, monkeypatch):
  _save(tmp_path, 2)

  def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(ckpt.os, "fsync", disk_full)
  with pytest.raises(HostError) as raised:
    _save(tmp_path, 4)
  assert str(raised.value) == ("no space left on device (writing checkpoint"
                               f" {tmp_path / 'checkpoints' / 'round_4'})")
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["round_2"]
  assert ckpt.latest_checkpoint(tmp_path).round_num == 2


def test_mismatched_state_is_a_user_error(tmp_path):
  _save(tmp_path, 1)
  template = _state(0.0)
  template["model"] = (np.zeros((4, 3), np.float32), np.zeros(3, np.float32))
  with pytest.raises(UserError, match="does not match the model"):
    ckpt.latest_checkpoint(tmp_path).server_state(template)


def test_client_state_snapshot_survives_later_saves(tmp_path):
  store = ClientStateStore(tmp_path / "client_states", (np.zeros(2, np.float32),))
  store.save(["a", "b"], [(np.ones(2, np.float32),), (np.full(2, 2.0, np.float32),)])
  store.flush()  # as the run loop does before each checkpoint
  _save(tmp_path, 1, client_states=store.directory)
  store.save(["a", "c"], [(np.full(2, 9.0, np.float32),)] * 2)  # rounds after the checkpoint
  store.flush()
  ckpt.restore_client_states(ckpt.latest_checkpoint(tmp_path), store.directory)
  assert sorted(p.name for p in store.directory.iterdir()) == ["a.npz", "b.npz"]
  resumed = ClientStateStore(store.directory, (np.zeros(2, np.float32),))
  a, b, c = resumed.load(["a", "b", "c"])
  assert a[0].tolist() == [1, 1] and b[0].tolist() == [2, 2] and c[0].tolist() == [0, 0]


def test_free_space_check_names_the_directory(tmp_path):
  durable.check_free_space(tmp_path, 1)
  with pytest.raises(UserError, match=f"checkpoint: {tmp_path} has .* MiB free"):
    durable.check_free_space(tmp_path, 2**62)


def test_rewind_keeps_each_round_once(tmp_path):
  from fedsim.reporting import TensorBoardSink
  sink = TensorBoardSink(tmp_path)
  # Accuracy by bits steps in bits: only the wall time of the checkpoint cuts it.
  for r in (1, 2):
    sink.write(r, {"train/loss": 1.0 / r})
    sink.write(1000 * r, {"eval/accuracy_by_bits": 0.5})
  time.sleep(0.01)
  _save(tmp_path, 2)
  sink.write(3, {"train/loss": 0.3})  # logged by the killed run after its checkpoint
  sink.write(3000, {"eval/accuracy_by_bits": 0.5})
  sink.close()
  (tmp_path / "events.log").write_text("round 1: skipped\nround 3: skipped\n")
  rewind_logs(tmp_path, ckpt.latest_checkpoint(tmp_path))
  assert (tmp_path / "events.log").read_text() == "round 1: skipped\n"
  # TensorBoard reads files in name order, and names hold the creation second;
  # a resumed run starts seconds later (it rebuilds the simulation first).
  time.sleep(1.1)
  sink = TensorBoardSink(tmp_path)  # the resumed run
  for r in (3, 4):
    sink.write(r, {"train/loss": 1.0 / r})
    sink.write(1000 * r, {"eval/accuracy_by_bits": 0.5})
  sink.close()
  assert steps_by_tag(tmp_path) == {"train/loss": [1, 2, 3, 4],
                                    "eval/accuracy_by_bits": [1000, 2000, 3000, 4000]}


def test_rewind_drops_a_torn_last_event(tmp_path):
  from fedsim.reporting import TensorBoardSink
  sink = TensorBoardSink(tmp_path)
  for r in (1, 2):
    sink.write(r, {"train/loss": 1.0 / r})
  sink.close()
  (events,) = tmp_path.glob("events.out.tfevents.*")
  whole = events.read_bytes()
  events.write_bytes(whole[:-5])  # a kill in the middle of round 2's record
  assert rewrite_event_file(events, time.time()) == 1
  assert steps_by_tag(tmp_path) == {"train/loss": [1]}
  assert rewrite_event_file(events, time.time()) == 0
