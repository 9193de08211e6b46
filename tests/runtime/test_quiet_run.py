"""A real `fedsim run` says nothing on stderr: no grappler or deprecation noise.

TFF compiles the round at `initialize` (grappler then logs 'Failed to detect
the fetch node(s)' as an error for compressed processes), and resuming reads
TensorBoard files back (tf.compat.v1's summary iterator logs a deprecation
warning). Both run in a fresh interpreter here, where every such message
appears once.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).parents[2]
CONFIG = """
name: quiet
seed: 1
rounds: 1
clients_per_round: 2
data: {name: digits, num_clients: 4, partition: iid, batch_size: 32}
model: {name: logistic}
algorithm: {name: fedavg}
compression: {aggregation: {encoder: uniform, bits: 8, min_elements: 100}}
"""


def _fedsim(tmp_path, *args: str) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env["PYTHONPATH"] = str(REPO)
  return subprocess.run([sys.executable, "-m", "fedsim.cli", "run", str(tmp_path / "q.yaml"),
                         "--logdir", str(tmp_path / "runs"), "--no-progress", *args],
                        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
                        check=False)


@pytest.mark.slow
@pytest.mark.long  # two CLI runs (~40 s); e2e/test_cli.py checks for no traceback only
def test_compressed_run_and_its_resume_print_nothing_on_stderr(tmp_path):
  (tmp_path / "q.yaml").write_text(CONFIG)
  first = _fedsim(tmp_path)
  assert first.returncode == 0 and first.stderr == "", first.stderr
  (run_dir,) = [p for p in (tmp_path / "runs" / "quiet").iterdir() if (p / "config.yaml").is_file()]
  resumed = _fedsim(tmp_path, "--resume", str(run_dir), "--set", "rounds=2")
  assert resumed.returncode == 0 and resumed.stderr == "", resumed.stderr
  assert f"resuming {run_dir} after round 1 of 2" in resumed.stdout
