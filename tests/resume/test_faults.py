"""Refused resumes, divergence, a dead worker, a full disk, and extending a run."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import signal

import numpy as np
import pytest
import yaml

import fedsim
from fedsim import cli
from fedsim.errors import RunFailed, UserError
from fedsim.experiment import loop
from fedsim.experiment.config.loader import load_config, plain
from fedsim.reporting import read_metrics_csv, read_status
from fedsim.state import checkpoint as ckpt
from fedsim.state import checkpoint_writer
from tests.resume.events import steps_by_tag

CONFIG = {
    "name": "faults", "seed": 2, "rounds": 3, "clients_per_round": 2,
    "data": {"name": "digits", "num_clients": 4, "partition": "iid", "batch_size": 32},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": 0.1}},
    "eval": {"every": 3},
    "checkpoint": {"every": 1, "keep": 5},
}


def _fake_run(logdir: pathlib.Path, config: dict, status: str = "running") -> pathlib.Path:
  """A run directory as a killed run leaves it: config.yaml, status, a checkpoint."""
  run_dir = logdir / config["name"] / "20260101-000000"
  run_dir.mkdir(parents=True)
  resolved = plain(load_config(config)[0])
  resolved.pop("variants")
  (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved))
  (run_dir / "status").write_text(status + "\n")
  ckpt.save_checkpoint(run_dir, 1, [np.zeros(2)], 0.0, [1], [1], keep=1)
  return run_dir


def _main(capsys, *args) -> tuple[int, list[str]]:
  code = cli.main(["run", *args])
  return code, capsys.readouterr().err.strip().splitlines()


def test_changed_config_is_refused_with_the_keys(tmp_path, capsys):
  run_dir = _fake_run(tmp_path, CONFIG)
  path = tmp_path / "c.yaml"
  path.write_text(yaml.safe_dump(CONFIG))
  code, err = _main(capsys, str(path), "--logdir", str(tmp_path), "--resume", "--set", "seed=3",
                    "--set", "algorithm.client_optimizer.learning_rate=0.2",
                    "--set", "rounds=9", "--set", "checkpoint.keep=1")
  assert code == 2
  assert err == [f"fedsim: error: {run_dir}: the config differs from the checkpointed run"
                 " in algorithm.client_optimizer.learning_rate, seed (only rounds and"
                 " checkpoint.* may change); leave out --resume to start a new run"]


@pytest.mark.parametrize("args,message", [
    (["--resume"], "--resume: no run of faults under {tmp}/faults to resume; leave out"
                   " --resume to start the study"),
    (["--resume", "{tmp}/nope"], "--resume {tmp}/nope: no such directory"),
    (["--resume", "{tmp}"], "--resume {tmp}: not a fedsim run or study directory"),
])
def test_nothing_to_resume(tmp_path, capsys, args, message):
  path = tmp_path / "c.yaml"
  path.write_text(yaml.safe_dump(CONFIG))
  args = [a.format(tmp=tmp_path) for a in args]
  code, err = _main(capsys, str(path), "--logdir", str(tmp_path), *args)
  assert code == 2 and len(err) == 1
  assert err[0].startswith("fedsim: error: " + message.format(tmp=tmp_path))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]  # nothing written


def test_a_run_starts_a_new_directory_unless_told_to_resume(tmp_path):
  from fedsim.experiment import resume
  run_dir = _fake_run(tmp_path, CONFIG)  # interrupted, with a checkpoint
  resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
  for fresh in (False, True):
    assert resume.choose(tmp_path, "faults", None, resolved, None, fresh) is None
  assert resume.choose(tmp_path, "faults", None, resolved, True, False).run_dir == run_dir
  with pytest.raises(UserError, match="--fresh and --resume exclude each other"):
    resume.choose(tmp_path, "faults", None, resolved, True, True)


def test_a_run_written_before_a_key_existed_resumes_but_a_changed_default_is_refused(tmp_path):
  """An older fedsim wrote no `eval.federated`; today's default keeps its behaviour."""
  from fedsim.experiment import resume
  run_dir = _fake_run(tmp_path, CONFIG)
  resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
  older = {k: v for k, v in resolved.items() if k != "broadcast"}
  older["eval"] = {k: v for k, v in resolved["eval"].items() if k != "federated"}
  (run_dir / "config.yaml").write_text(yaml.safe_dump(older))
  assert resume.choose(tmp_path, "faults", None, resolved, True, False).run_dir == run_dir
  changed = dict(resolved, eval=dict(resolved["eval"], federated=True))
  with pytest.raises(UserError, match=r"differs from the checkpointed run in eval\.federated "):
    resume.choose(tmp_path, "faults", None, changed, True, False)


def test_completed_run_is_not_resumed_unless_rounds_grow(tmp_path):
  run_dir = _fake_run(tmp_path, dict(CONFIG, rounds=1), status="completed")
  with pytest.raises(UserError, match="already ran 1 rounds"):
    fedsim.run(dict(CONFIG, rounds=1), logdir=tmp_path, resume=run_dir)


@pytest.mark.slow
def test_divergence_keeps_the_last_good_checkpoint(tff_runtime, tmp_path, capsys):
  path = tmp_path / "c.yaml"
  path.write_text(yaml.safe_dump(CONFIG))
  code, err = _main(capsys, str(path), "--logdir", str(tmp_path), "--set",
                    "algorithm.client_optimizer.learning_rate=1.0e+37",
                    "--set", "algorithm.local_steps=1")  # round 1 ends finite
  assert code == 1 and len(err) == 1
  assert err[0].startswith("fedsim: run failed: round ") and "training diverged" in err[0]
  failed_round = int(err[0].split()[4].rstrip(":"))
  assert failed_round >= 2  # so that there is a good checkpoint to keep
  (run_dir,) = _run_dirs(tmp_path / "faults")
  status, message = read_status(run_dir)
  assert status == "failed" and message.startswith(f"round {failed_round}: training diverged")
  rounds = [r["round"] for r in read_metrics_csv(run_dir / "metrics.csv")] \
      if (run_dir / "metrics.csv").exists() else []
  assert rounds == list(range(1, failed_round))
  latest = ckpt.latest_checkpoint(run_dir)
  assert (latest.round_num if latest else 0) == failed_round - 1
  assert not (run_dir / "final_model.npz").exists()


@pytest.mark.slow
def test_dead_worker_fails_the_round_then_the_run_resumes_and_extends(tff_runtime, tmp_path):
  config = dict(CONFIG, runtime={"name": "local"})  # rounds on the TFF worker this test kills

  def kill_worker_after_round_2(round_num, metrics):
    del metrics
    if round_num == 2:
      os.kill(_worker_pid(tmp_path / "faults"), signal.SIGKILL)

  with pytest.raises(RunFailed, match=r"TFF worker process \(pid \d+\) died during round 3;"
                                      r" see .*worker.log"):
    fedsim.run(config, logdir=tmp_path, on_round=kill_worker_after_round_2)
  (run_dir,) = _run_dirs(tmp_path / "faults")
  status, message = read_status(run_dir)
  assert status == "failed" and "died during round 3" in message
  assert ckpt.latest_checkpoint(run_dir).round_num == 2

  resumed = fedsim.run(config, logdir=tmp_path, resume=True)  # picks up the failed run
  assert resumed.run_dir == run_dir and [r["round"] for r in resumed.metrics] == [1, 2, 3]
  extended = fedsim.run(config, ["rounds=4"], logdir=tmp_path, resume=run_dir)
  assert [r["round"] for r in read_metrics_csv(run_dir / "metrics.csv")] == [1, 2, 3, 4]
  assert steps_by_tag(run_dir)["train/loss"] == [1, 2, 3, 4]
  assert steps_by_tag(run_dir)["final/eval/accuracy"] == [4]
  straight = fedsim.run(config, ["rounds=4"], logdir=tmp_path, fresh=True)
  assert straight.run_dir != run_dir
  for got, want in zip(extended.final_weights, straight.final_weights):
    np.testing.assert_array_equal(got, want)
  assert extended.metrics[-1]["eval/accuracy"] == straight.metrics[-1]["eval/accuracy"]


@pytest.mark.slow
def test_too_little_disk_is_a_user_error_before_training(tff_runtime, tmp_path, monkeypatch):
  monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda path: type("U", (), {"free": 1000}))
  with pytest.raises(UserError, match="checkpoint: .* MiB free"):
    fedsim.run(CONFIG, logdir=tmp_path)
  (run_dir,) = _run_dirs(tmp_path / "faults")
  assert read_status(run_dir)[0] == "failed" and not (run_dir / "metrics.csv").exists()


def _stop_after_round(monkeypatch, round_num: int, action) -> None:
  """Calls `action()` right after round `round_num` has run, before it is logged."""
  play = loop._play_round

  def play_then_act(sim, state, states, played, *args):
    out = play(sim, state, states, played, *args)
    if played == round_num:
      action()
    return out

  monkeypatch.setattr(loop, "_play_round", play_then_act)


def _fill_once_round_1_is_durable(monkeypatch, small_disk) -> None:
  """Fills the disk after round 2 has run, once round 1's checkpoint is on disk:
  its write runs while round 2 trains, so under load a disk filled as soon as
  round 2 ends could fail that write instead (a run that then keeps no
  checkpoint, as it would have in line with a disk full a moment earlier)."""
  played, filled = [], []
  _stop_after_round(monkeypatch, 2, lambda: played.append(2))
  wait = checkpoint_writer.CheckpointWriter.wait

  def wait_then_fill(writer):
    wait(writer)
    if played and not filled:
      filled.append(2)
      small_disk.fill()

  monkeypatch.setattr(checkpoint_writer.CheckpointWriter, "wait", wait_then_fill)


@pytest.mark.slow
def test_full_disk_fails_in_one_line_and_the_run_resumes_once_freed(
    tff_runtime, small_disk, tmp_path, monkeypatch, capsys):
  path = tmp_path / "c.yaml"
  path.write_text(yaml.safe_dump(dict(CONFIG, rounds=4)))
  logdir = small_disk.path / "runs"
  _fill_once_round_1_is_durable(monkeypatch, small_disk)
  code, err = _main(capsys, str(path), "--logdir", str(logdir))
  assert code == 1
  (run_dir,) = _run_dirs(logdir / "faults")
  assert len(err) == 1, err
  error, hint = err[0].split("; resume with: ")
  assert re.fullmatch(rf"fedsim: error: no space left on device \(writing .*{run_dir}/.*\)",
                      error), err
  assert hint == f"fedsim run --resume {logdir / 'faults'}"  # the whole study
  status, message = read_status(run_dir)
  assert status == "failed" and message == error[len("fedsim: error: "):]
  assert ckpt.latest_checkpoint(run_dir).round_num == 1

  small_disk.free()
  monkeypatch.undo()
  code, err = _main(capsys, str(path), "--logdir", str(logdir), "--resume")
  assert code == 0, err
  assert read_status(run_dir) == ("completed", "")
  assert [r["round"] for r in read_metrics_csv(run_dir / "metrics.csv")] == [1, 2, 3, 4]
  assert steps_by_tag(run_dir)["train/loss"] == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit(143)], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_says_so_and_resumes(tff_runtime, tmp_path, monkeypatch, capsys,
                                                stop):
  path = tmp_path / "c.yaml"
  path.write_text(yaml.safe_dump(CONFIG))

  def interrupt():
    raise stop

  _stop_after_round(monkeypatch, 2, interrupt)
  args = [str(path), "--logdir", str(tmp_path), "--set", "seed=5", "--set", "eval.every=2"]
  if stop is KeyboardInterrupt:
    code, err = _main(capsys, *args)
  else:
    with pytest.raises(SystemExit):
      cli.main(["run", *args])
  (run_dir,) = _run_dirs(tmp_path / "faults")
  assert read_status(run_dir) == ("interrupted", "")
  monkeypatch.undo()
  if stop is KeyboardInterrupt:
    # The command printed, which retypes neither the config nor the --set keys.
    assert (code, err) == (
        130, [f"fedsim: interrupted; resume with: fedsim run --resume {run_dir.parent}"])
    command = shlex.split(err[0].split("resume with: ")[1])
    assert command[:2] == ["fedsim", "run"]
    code, err = _main(capsys, *command[2:])
    assert code == 0, err
    rounds = [r["round"] for r in read_metrics_csv(run_dir / "metrics.csv")]
  else:
    resumed = fedsim.run(CONFIG, ["seed=5", "eval.every=2"], logdir=tmp_path, resume=True)
    assert resumed.run_dir == run_dir
    rounds = [r["round"] for r in resumed.metrics]
  assert rounds == [1, 2, 3] and read_status(run_dir) == ("completed", "")
  assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == 5


def _run_dirs(experiment_dir: pathlib.Path) -> list[pathlib.Path]:
  """The run directories of an experiment (not its TensorBoard comparison run)."""
  return [p for p in experiment_dir.iterdir() if (p / "config.yaml").is_file()]


def _worker_pid(experiment_dir: pathlib.Path) -> int:
  """The pid of the TFF worker whose output goes to a run's worker.log."""
  (log,) = experiment_dir.glob("*/worker.log")
  for pid in os.listdir("/proc"):
    try:
      if pid.isdigit() and os.readlink(f"/proc/{pid}/fd/1") == str(log.resolve()):
        return int(pid)
    except OSError:
      continue
  raise AssertionError(f"no process writes to {log}")
