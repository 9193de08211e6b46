"""Checkpoints written while the next round runs keep what a checkpoint written
in line keeps (see fedsim.state.checkpoint_writer for the invariant)."""

from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

import fedsim
from fedsim.errors import HostError
from fedsim.state import checkpoint as ckpt
from fedsim.state.checkpoint_writer import CheckpointWriter
from fedsim.state.client_states import ClientStateStore
from fedsim.reporting import read_metrics_csv


def _stage(run_dir, round_num, value, client_states=None, keep=3):
  return ckpt.stage_checkpoint(run_dir, round_num, [np.full(3, value, np.float32)],
                               float(round_num), [1] * round_num, [2] * round_num, keep,
                               client_states)


def test_a_staged_checkpoint_holds_the_round_it_was_taken_after(tmp_path):
  store = ClientStateStore(tmp_path / "client_states", (np.zeros(2, np.float32),))
  store.save(["a"], [(np.ones(2, np.float32),)])
  store.flush()
  state = [np.full(3, 1.0, np.float32)]
  staged = ckpt.stage_checkpoint(tmp_path, 1, state, 1.0, [1], [2], 3, store.directory)
  # The next round runs before the write: new states, a new server state.
  store.save(["a", "b"], [(np.full(2, 9.0, np.float32),)] * 2)
  store.flush()
  state = [np.full(3, 9.0, np.float32)]
  writer = CheckpointWriter()
  writer.submit(staged)
  writer.close()
  latest = ckpt.latest_checkpoint(tmp_path)
  assert latest.round_num == 1 and latest.broadcast_history == (1,)
  np.testing.assert_array_equal(latest.server_state([np.zeros(3, np.float32)])[0],
                                np.full(3, 1.0, np.float32))
  assert sorted(p.name for p in latest.client_states.iterdir()) == ["a.npz"]
  with np.load(latest.client_states / "a.npz") as saved:
    assert saved["arr_0"].tolist() == [1, 1]
  assert ckpt.intact_checkpoints(tmp_path, hash_all=True)[1] == []


def test_one_write_in_flight_and_a_failed_one_is_raised_at_the_next_wait(tmp_path, monkeypatch):
  writer = CheckpointWriter()
  writer.submit(_stage(tmp_path, 2, 2.0))
  with pytest.raises(RuntimeError, match="still being written"):
    writer.submit(_stage(tmp_path, 3, 3.0))
  writer.wait()

  def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, "fsync", disk_full)
  writer.submit(_stage(tmp_path, 4, 4.0))
  with pytest.raises(HostError, match=r"^no space left on device \(writing checkpoint .*round_4\)"):
    writer.wait()
  monkeypatch.undo()
  writer.wait()  # raised once
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["round_2"]
  assert ckpt.latest_checkpoint(tmp_path).round_num == 2
  writer.submit(_stage(tmp_path, 4, 4.0))  # the writer goes on after a failure
  writer.close()
  assert ckpt.latest_checkpoint(tmp_path).round_num == 4
  assert not [t for t in threading.enumerate() if t.name.startswith("fedsim-checkpoint")]


def test_wait_returns_once_durable_and_settle_once_the_old_checkpoints_are_deleted(
    tmp_path, monkeypatch):
  writer = CheckpointWriter()
  writer.submit(_stage(tmp_path, 1, 1.0, keep=1))
  writer.settle()
  pruning, release = threading.Event(), threading.Event()
  prune = ckpt.StagedCheckpoint.prune

  def held_prune(self):
    pruning.set()
    assert release.wait(10)
    prune(self)

  monkeypatch.setattr(ckpt.StagedCheckpoint, "prune", held_prune)
  writer.submit(_stage(tmp_path, 2, 2.0, keep=1))
  writer.wait()  # durable: round 2 is complete, round 1 not yet deleted
  assert pruning.wait(10)
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["round_1", "round_2"]
  assert ckpt.latest_checkpoint(tmp_path).round_num == 2
  release.set()
  writer.settle()
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["round_2"]
  writer.close()
  assert not [t for t in threading.enumerate() if t.name.startswith("fedsim-checkpoint")]


def test_quiet_close_settles_the_write_and_drops_its_error(tmp_path, monkeypatch):
  writer = CheckpointWriter()
  writer.submit(_stage(tmp_path, 1, 1.0))
  writer.wait()
  monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))
  writer.submit(_stage(tmp_path, 2, 2.0))
  writer.close(quietly=True)
  assert ckpt.latest_checkpoint(tmp_path).round_num == 1
  assert not [t for t in threading.enumerate() if t.name.startswith("fedsim-checkpoint")]


@pytest.mark.slow
def test_a_round_is_logged_only_once_the_checkpoint_before_it_is_on_disk(tff_runtime, tmp_path):
  seen = []

  class Check(fedsim.Callback):
    def after_round(self, run, record):
      # Row r is in metrics.csv: the checkpoint of r-1 must be complete and intact.
      rows = [int(r["round"]) for r in read_metrics_csv(run.run_dir / "metrics.csv")]
      latest = ckpt.latest_checkpoint(run.run_dir)
      seen.append((rows[-1], latest.round_num if latest else 0))

  config = {"name": "writer", "seed": 1, "rounds": 4, "clients_per_round": 2,
            "data": {"name": "digits", "num_clients": 4, "partition": "iid", "batch_size": 32},
            "model": {"name": "logistic"}, "algorithm": {"name": "fedavg"},
            "runtime": {"name": "inprocess", "device": "cpu"},
            "checkpoint": {"every": 1, "keep": 2}}
  result = fedsim.run(config, logdir=tmp_path, progress=False, callbacks=[Check()])
  assert [row for row, _ in seen] == [1, 2, 3, 4]
  assert all(checkpointed >= row - 1 for row, checkpointed in seen), seen
  # The run ends with its last checkpoint on disk, the writer's thread gone.
  assert ckpt.latest_checkpoint(result.run_dir).round_num == 4
  assert not [t for t in threading.enumerate() if t.name.startswith("fedsim-checkpoint")]
