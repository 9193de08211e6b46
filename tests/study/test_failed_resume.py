"""A resume that fails before its first round leaves `failed` and why, not the
dead writer's 'running'."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from fedsim import cli
from fedsim.errors import RunFailed
from fedsim.reporting.ownership import Writer, _proc_stat
from fedsim.reporting.rundir import read_status
from fedsim.runtime import session as sessions
from fedsim.state import checkpoint as ckpt
from fedsim.study import runner
from tests.study.test_plan import CONFIG


def _dead_writer() -> Writer:
  child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
  start = _proc_stat(child.pid)[1]
  child.wait()
  return Writer(child.pid, socket.gethostname(), start)


@pytest.mark.slow
def test_a_failed_resume_says_failed_and_why(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(runner, "executor_for", lambda jobs: _Nothing())
  runner.run_study(dict(CONFIG, seeds=[0], variants={"a": {}}), logdir=tmp_path)
  monkeypatch.undo()
  study_dir = tmp_path / "st"
  run_dir = study_dir / "a-seed0"
  # As a run killed after its first checkpoint leaves it: 'running', by a process now gone.
  (run_dir / "status").write_text(f"running\n{_dead_writer().line()}\n")
  ckpt.save_checkpoint(run_dir, 1, [np.zeros(2)], 0.0, [1], [1], keep=1)
  assert read_status(run_dir)[0] == "killed"

  @contextlib.contextmanager
  def worker_dies_at_start(*args, **kwargs):
    raise RunFailed("TFF worker process (pid 4711) exited with code -9 before answering")
    yield  # pylint: disable=unreachable

  monkeypatch.setattr(sessions, "session", worker_dies_at_start)
  assert cli.main(["run", "--resume", str(study_dir), "--no-progress"]) == 1
  err = capsys.readouterr().err.splitlines()
  assert err == ["fedsim: run failed: TFF worker process (pid 4711) exited with code -9 before"
                 f" answering; resume with: fedsim run --resume {study_dir}"]
  assert read_status(run_dir) == (
      "failed", "TFF worker process (pid 4711) exited with code -9 before answering")
  assert cli.main(["status", str(study_dir)]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[1].split()[:3] == ["a-seed0", "failed", "1/3"]
  assert lines[1].endswith("TFF worker process (pid 4711) exited with code -9 before answering")
  assert lines[-1] == f"resume with: fedsim run --resume {study_dir}"  # a retry can succeed


class _Nothing:
  def play(self, runs, context):
    del runs, context
    return iter(())
