"""Checkpoints damaged after they were written: status tells, --resume falls back."""

from __future__ import annotations

import csv
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from fedsim import cli
from fedsim.errors import UserError
from fedsim.experiment import resume
from fedsim.run_status import run_status
from fedsim.state import checkpoint as ckpt

RESOLVED = {"name": "exp", "rounds": 5}


def _run_with_two_checkpoints(tmp_path, name="run"):
  """A killed run: status 'interrupted', 3 rounds logged, checkpoints of rounds 2 and 3,
  each with two client states (round 3 rewrote client b's)."""
  run_dir = tmp_path / "exp" / name
  states = run_dir / "client_states"
  states.mkdir(parents=True)
  (run_dir / "config.yaml").write_text(yaml.safe_dump(RESOLVED))
  (run_dir / "status").write_text("interrupted\n")
  (run_dir / "metrics.csv").write_text("round,train/loss\n1,0.5\n2,0.4\n3,0.3\n")
  for name in ("a", "b"):
    np.savez(states / f"{name}.npz", np.full(3, 2.0))
  ckpt.save_checkpoint(run_dir, 2, [np.full(4, 2.0)], 2.0, [1, 1], [1, 1], keep=5,
                       client_states=states)
  np.savez(states / "b.tmp.npz", np.full(3, 3.0))
  (states / "b.tmp.npz").replace(states / "b.npz")  # as the store replaces a file
  ckpt.save_checkpoint(run_dir, 3, [np.full(4, 3.0)], 3.0, [1] * 3, [1] * 3, keep=5,
                       client_states=states)
  return run_dir


def _flip_one_byte(path):
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x01
  path.write_bytes(bytes(data))


DAMAGES = {
    "server_state truncated": ("server_state.npz", lambda p: p.write_bytes(p.read_bytes()[:40])),
    "server_state garbage": ("server_state.npz", lambda p: p.write_bytes(b"\x00garbage" * 9)),
    "server_state one byte flipped": ("server_state.npz", _flip_one_byte),
    "progress truncated": ("progress.json", lambda p: p.write_text(p.read_text()[:10])),
    "progress one byte flipped": ("progress.json", _flip_one_byte),
    "client state truncated": ("client_states/b.npz", lambda p: p.write_bytes(b"PK")),
    "client state one byte flipped": ("client_states/b.npz", _flip_one_byte),
    "client state missing": ("client_states/b.npz", lambda p: p.unlink()),
    "client state added": ("client_states/c.npz", lambda p: np.savez(p, np.zeros(3))),
}


@pytest.mark.parametrize("name", DAMAGES)
def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, capsys, name):
  run_dir = _run_with_two_checkpoints(tmp_path)
  relative, damage = DAMAGES[name]
  # In place: a client state is also the live file's inode, damaged with it, as a disk would.
  damage(run_dir / "checkpoints" / "round_3" / relative)
  chosen = resume.check_resumable(run_dir, RESOLVED)
  chosen.lock.release()
  assert chosen.checkpoint.round_num == 2
  with np.load(chosen.checkpoint.path / ckpt.SERVER_STATE) as f:
    assert f["arr_0"].tolist() == [2.0] * 4
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith(f"fedsim: {run_dir}: checkpoint round_3/")
  assert err[0].endswith("resuming from round 2 (damaged checkpoints moved to damaged_round_*)")
  assert (run_dir / "checkpoints" / "damaged_round_3").is_dir()  # kept, not deleted


def test_status_names_a_damaged_checkpoint_and_keeps_the_rounds(tmp_path, capsys):
  run_dir = _run_with_two_checkpoints(tmp_path)
  path = run_dir / "checkpoints" / "round_3" / ckpt.PROGRESS
  path.write_text(path.read_text()[:7])  # truncated
  other = _run_with_two_checkpoints(tmp_path, "other")
  assert cli.main(["status", str(tmp_path)]) == 1
  lines = capsys.readouterr().out.splitlines()
  # 3 rounds logged still show (it said 'round 0, no checkpoint'); the intact one is named.
  assert lines[0] == f"{other}: interrupted, round 3 of 5, checkpoint at round 3"
  assert lines[1].startswith(f"{run_dir}: interrupted, round 3 of 5, checkpoint at round 2:"
                             " damaged checkpoint round_3/progress.json: 7 bytes, ")
  assert len(lines) == 2


def test_resume_refuses_when_no_checkpoint_is_intact(tmp_path):
  run_dir = _run_with_two_checkpoints(tmp_path)
  for round_num in (2, 3):
    (run_dir / "checkpoints" / f"round_{round_num}" / ckpt.SERVER_STATE).write_bytes(b"x")
  with pytest.raises(UserError, match=rf"--resume {run_dir}: no intact checkpoint \(round_3/"
                                      r"server_state.npz: 1 bytes, \d+ when written; round_2/"):
    resume.check_resumable(run_dir, RESOLVED)
  assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["round_2", "round_3"]


def test_a_checkpoint_written_before_manifests_is_still_taken(tmp_path):
  run_dir = _run_with_two_checkpoints(tmp_path)
  (run_dir / "checkpoints" / "round_3" / "COMPLETE").write_text("round 3\n")
  assert ckpt.intact_checkpoints(run_dir, hash_all=True)[0].round_num == 3


def test_unchanged_client_states_are_not_hashed_again(tmp_path, monkeypatch):
  from fedsim.state import checkpoint_manifest
  run_dir = _run_with_two_checkpoints(tmp_path)
  hashed = []
  real = checkpoint_manifest._sha256
  monkeypatch.setattr(checkpoint_manifest, "_sha256", lambda p: hashed.append(p.name) or real(p))
  ckpt.save_checkpoint(run_dir, 4, [np.full(4, 4.0)], 4.0, [1] * 4, [1] * 4, keep=5,
                       client_states=run_dir / "client_states")
  assert sorted(hashed) == ["progress.json", "server_state.npz"]



E2E_ROUNDS = 12
E2E_CONFIG = f"""
name: flip
seed: 11
rounds: {E2E_ROUNDS}
clients_per_round: 3
data: {{name: digits, num_clients: 6, partition: iid, batch_size: 32}}
model: {{name: logistic}}
algorithm: {{name: fedavg}}
eval: {{every: 1}}
checkpoint: {{every: 2, keep: 2}}
"""


def _fedsim_run(*args: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", "fedsim.cli", "run", *args, "--no-progress"],
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _complete_checkpoints(logdir: pathlib.Path) -> list[pathlib.Path]:
  """round_N directories of the run under `logdir` that are in place, oldest first."""
  found = [p for p in logdir.glob("flip/*/checkpoints/round_*") if (p / "COMPLETE").is_file()]
  return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def _rows(run_dir: pathlib.Path) -> list[dict[str, str]]:
  with open(run_dir / "metrics.csv", newline="") as f:
    return [{k: v for k, v in row.items() if k != "round_seconds"} for row in csv.DictReader(f)]


def _kill_after_two_checkpoints(run: subprocess.Popen, logdir: pathlib.Path) -> None:
  try:
    deadline = time.monotonic() + 300
    while len(_complete_checkpoints(logdir)) < 2:
      assert run.poll() is None, run.communicate()
      assert time.monotonic() < deadline, "no second checkpoint in time"
      time.sleep(0.02)
    run.send_signal(signal.SIGKILL)
  finally:
    run.kill()
    run.communicate()


# `-m long` for CI time: the fallback itself is test_resume_falls_back_to_the_newest_
# intact_checkpoint's (every damage, every run); this is the same end to end.
@pytest.mark.slow
@pytest.mark.long
def test_a_flipped_byte_in_a_killed_runs_newest_checkpoint_resumes_from_the_older_one(tmp_path):
  """End to end: SIGKILL after the second checkpoint, one byte of the newest
  server_state.npz flipped, `--resume`: one line, the older checkpoint, and the
  same metrics.csv and final model as a run never interrupted."""
  config = tmp_path / "flip.yaml"
  config.write_text(E2E_CONFIG)
  reference = _fedsim_run(str(config), "--logdir", str(tmp_path / "reference"))
  try:
    _kill_after_two_checkpoints(_fedsim_run(str(config), "--logdir", str(tmp_path / "runs")),
                                tmp_path / "runs")
    *older, newest = _complete_checkpoints(tmp_path / "runs")
    assert older and int(newest.name.split("_")[1]) < E2E_ROUNDS  # killed mid-run
    _flip_one_byte(newest / ckpt.SERVER_STATE)
    run_dir, fallback = newest.parents[1], older[-1].name.split("_")[1]

    resumed = _fedsim_run(str(config), "--logdir", str(tmp_path / "runs"), "--resume",
                          str(run_dir))
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"fedsim: {run_dir}: checkpoint {newest.name}/server_state.npz: ")
    assert err.endswith(f"resuming from round {fallback} (damaged checkpoints moved to"
                        " damaged_round_*)\n")
    assert f"resuming {run_dir} after round {fallback} of" in out
    _, ref_err = reference.communicate(timeout=600)
    assert reference.returncode == 0, ref_err
  finally:
    reference.kill()
    reference.communicate()
  ref_dir = next((tmp_path / "reference").glob("flip/*/metrics.csv")).parent
  assert (run_dir / "status").read_text().startswith("completed")
  rows = _rows(run_dir)
  assert [r["round"] for r in rows] == [str(r) for r in range(1, E2E_ROUNDS + 1)]
  assert rows == _rows(ref_dir)  # every metric, as the uninterrupted run wrote it
  with np.load(run_dir / "final_model.npz") as got, np.load(ref_dir / "final_model.npz") as want:
    assert sorted(got.files) == sorted(want.files)
    for name in want.files:
      np.testing.assert_array_equal(got[name], want[name])
