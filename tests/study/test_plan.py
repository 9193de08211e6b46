"""A study's plan, its status table and when it offers a resume; no TensorFlow."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest
import yaml

from fedsim import cli
from fedsim.errors import UserError
from fedsim.experiment.config.loader import expand_variants, load_config, plain
from fedsim.run_status import run_status
from fedsim.state import checkpoint as ckpt
from fedsim.study import runner
from fedsim.study.plan import read_plan

CONFIG = {
    "name": "st", "seed": 2, "rounds": 3, "clients_per_round": 2,
    "data": {"name": "digits", "num_clients": 4, "partition": "iid", "batch_size": 32},
    "model": {"name": "logistic"},
    "checkpoint": {"every": 1, "keep": 5},
    "seeds": [0, 1],
    "variants": {"a": {}, "b": {"rounds": 2}},
}
LABELS = ["a-seed0", "a-seed1", "b-seed0", "b-seed1"]


def _resolved(config=CONFIG):
  out = []
  for label, cfg in expand_variants(load_config(config)[1]):
    resolved = plain(cfg)
    resolved.pop("variants")
    out.append((label, resolved))
  return out


class _Recorder:
  """An executor that records what it was given to play (and plays nothing)."""

  def __init__(self):
    self.played = []

  def play(self, runs, context):
    del context
    self.played.extend(run.label for run in runs)
    return iter(())


@pytest.fixture
def recorder(monkeypatch):
  rec = _Recorder()
  monkeypatch.setattr(runner, "executor_for", lambda jobs: rec)
  return rec


def _finish(run_dir: pathlib.Path, rounds: int, status="completed", checkpoint=True):
  (run_dir / "metrics.csv").write_text(
      "round,eval/accuracy\n" + "".join(f"{r},0.{r}\n" for r in range(1, rounds + 1)))
  (run_dir / "status").write_text(status + "\n")
  if checkpoint:
    ckpt.save_checkpoint(run_dir, rounds, [np.zeros(2)], 0.0, [1] * rounds, [1] * rounds,
                         keep=1)


def test_a_fresh_study_plans_every_run_and_a_resume_plays_only_the_unfinished(
    tmp_path, recorder):
  study = runner.run_study(CONFIG, logdir=tmp_path)
  assert [r.label for r in study.planned] == LABELS == recorder.played
  study_dir = tmp_path / "st"
  assert [(r.label, r.run_dir) for r in read_plan(study_dir)] == [
      (label, study_dir / label) for label in LABELS]
  assert yaml.safe_load((study_dir / "b-seed1/config.yaml").read_text())["rounds"] == 2
  assert [run_status(r.run_dir).status for r in study.planned] == ["not started"] * 4

  _finish(study_dir / "a-seed0", 3)
  _finish(study_dir / "b-seed0", 1, status="interrupted")
  recorder.played.clear()
  study = runner.run_study(CONFIG, logdir=tmp_path, resume=True)
  assert [r.label for r in study.complete] == ["a-seed0"]
  assert recorder.played == ["a-seed1", "b-seed0", "b-seed1"]
  assert sorted(p.name for p in study_dir.iterdir()) == [*LABELS, "study.yaml"]  # no new dirs

  # The same from the study directory alone, each run with its own config.yaml.
  recorder.played.clear()
  study = runner.resume_study(study_dir)
  assert recorder.played == ["a-seed1", "b-seed0", "b-seed1"]
  # More rounds: the complete run is extended too.
  recorder.played.clear()
  runner.resume_study(study_dir, ["rounds=4"])
  assert recorder.played == LABELS
  assert yaml.safe_load((study_dir / "a-seed0/config.yaml").read_text())["rounds"] == 4


def test_a_fresh_run_of_one_variant_keeps_the_plan_of_the_others(tmp_path, recorder):
  runner.run_study(CONFIG, logdir=tmp_path)
  runner.run_study(CONFIG, logdir=tmp_path, variant="b")
  assert recorder.played == [*LABELS, "b-seed0", "b-seed1"]
  dirs = {r.label: r.run_dir.name for r in read_plan(tmp_path / "st")}
  assert dirs == {"a-seed0": "a-seed0", "a-seed1": "a-seed1",
                  "b-seed0": "b-seed0-1", "b-seed1": "b-seed1-1"}


def test_a_study_without_a_plan_adopts_its_newest_runs(tmp_path, recorder):
  runner.run_study(CONFIG, logdir=tmp_path)
  study_dir = tmp_path / "st"
  (study_dir / "study.yaml").unlink()  # as an older fedsim left it
  _finish(study_dir / "a-seed0", 3)
  runner.run_study(CONFIG, logdir=tmp_path, resume=True)
  assert recorder.played == [*LABELS, "a-seed1", "b-seed0", "b-seed1"]
  assert [r.run_dir.name for r in read_plan(study_dir)] == LABELS


def test_a_study_that_cannot_resume_is_refused_before_anything_runs(tmp_path, recorder):
  runner.run_study(CONFIG, logdir=tmp_path)
  recorder.played.clear()
  changed = dict(CONFIG, clients_per_round=3)
  with pytest.raises(UserError, match=r"a-seed0: the config differs from the checkpointed run"
                                      r" in clients_per_round "):
    runner.run_study(changed, logdir=tmp_path, resume=True)
  assert recorder.played == []
  with pytest.raises(UserError, match=r"--resume: no run of other under .* to resume; leave"
                                      r" out --resume to start the study"):
    runner.run_study(dict(CONFIG, name="other"), logdir=tmp_path, resume=True)


def test_a_complete_study_resumed_with_a_changed_key_is_refused_not_left_alone(
    tmp_path, recorder):
  """It exited 0 and did nothing: the --set was ignored without a word."""
  runner.run_study(CONFIG, logdir=tmp_path)
  study_dir = tmp_path / "st"
  for label, rounds in zip(LABELS, (3, 3, 2, 2)):
    _finish(study_dir / label, rounds)
  recorder.played.clear()
  runner.resume_study(study_dir)   # the same config: each left alone
  assert recorder.played == []
  with pytest.raises(UserError, match=r"a-seed0: the config differs from the checkpointed run"
                                      r" in model.activation, model.hidden, model.name "):
    runner.resume_study(study_dir, ["model=mlp"])
  with pytest.raises(UserError, match=r"a-seed0: the config differs from the checkpointed run"
                                      r" in clients_per_round "):
    runner.run_study(dict(CONFIG, clients_per_round=3), logdir=tmp_path, resume=True)
  assert recorder.played == []


def test_status_is_one_table_and_offers_a_resume_only_when_one_can_succeed(
    tmp_path, recorder, capsys):
  runner.run_study(CONFIG, logdir=tmp_path)
  study_dir = tmp_path / "st"
  _finish(study_dir / "a-seed0", 3)
  _finish(study_dir / "a-seed1", 2, status="failed\nround 3: training diverged (train/loss = nan)")
  _finish(study_dir / "b-seed0", 2)
  _finish(study_dir / "b-seed1", 1, status="interrupted")
  assert cli.main(["status", str(study_dir)]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert [line.split()[:3] for line in lines[:5]] == [
      ["run", "state", "round"], ["a-seed0", "completed", "3/3"],
      ["a-seed1", "failed", "2/3"], ["b-seed0", "completed", "2/2"],
      ["b-seed1", "interrupted", "1/2"]]
  assert "eval/accuracy 0.1000" in lines[4]
  assert lines[2].endswith("round 3: training diverged (train/loss = nan)")
  assert lines[5] == f"resume with: fedsim run --resume {study_dir}"

  # Every checkpoint of the interrupted run damaged: the resume would refuse.
  (study_dir / "b-seed1/checkpoints/round_1/server_state.npz").write_bytes(b"damaged")
  assert cli.main(["status", str(study_dir)]) == 1  # a damaged file
  lines = capsys.readouterr().out.splitlines()
  assert "damaged checkpoint round_1/server_state.npz" in lines[4]
  assert not any(line.startswith("resume with:") for line in lines)  # diverged: no retry
  with pytest.raises(UserError, match="no intact checkpoint"):
    runner.resume_study(study_dir)


def test_printed_commands_are_the_way_fedsim_was_started(tmp_path, recorder):
  """Through `uv run`, the venv's script, and `python -m`: each prints a command that works."""
  runner.run_study(CONFIG, logdir=tmp_path)
  study_dir = tmp_path / "st"
  venv_bin = pathlib.Path(sys.executable).parent
  env = {k: v for k, v in os.environ.items()
         if k not in ("UV", "UV_RUN_RECURSION_DEPTH", "VIRTUAL_ENV")}
  env["PATH"] = "/usr/bin:/bin"  # the venv not activated

  def offered(*command, **kwargs):
    done = subprocess.run([*command, "status", str(study_dir)], capture_output=True, text=True,
                          env=kwargs.get("env", env), timeout=120, check=True)
    return done.stdout.splitlines()[-1]

  assert offered(str(venv_bin / "fedsim")) == (
      f"resume with: {venv_bin / 'fedsim'} run --resume {study_dir}")
  assert offered(sys.executable, "-m", "fedsim.cli") == (
      f"resume with: {sys.executable} -m fedsim.cli run --resume {study_dir}")
  uv = _uv()
  if uv is not None:
    repo = pathlib.Path(__file__).resolve().parents[2]
    assert offered(uv, "run", "--no-sync", "--project", str(repo), "fedsim",
                   env=dict(env, PATH=f"{pathlib.Path(uv).parent}:/usr/bin:/bin")) == (
        f"resume with: uv run fedsim run --resume {study_dir}")


def _uv() -> str | None:
  import shutil
  return os.environ.get("UV") or shutil.which("uv")


def test_a_run_still_ending_is_waited_for_and_a_live_one_left_alone(
    tmp_path, recorder, lock_holder, monkeypatch):
  runner.run_study(CONFIG, logdir=tmp_path)
  study_dir = tmp_path / "st"
  ending = lock_holder(study_dir / "a-seed1")  # a stopped study's run, its process ending
  killer = threading.Timer(0.5, ending.kill)
  killer.start()
  recorder.played.clear()
  try:
    study = runner.resume_study(study_dir)
  finally:
    killer.join()
  assert study.live == [] and recorder.played == LABELS
  lock_holder(study_dir / "b-seed0")  # running, in another process
  monkeypatch.setattr(runner, "_ENDING_S", 0.3)
  recorder.played.clear()
  study = runner.resume_study(study_dir)
  assert [r.label for r in study.live] == ["b-seed0"]
  assert recorder.played == ["a-seed0", "a-seed1", "b-seed1"]
