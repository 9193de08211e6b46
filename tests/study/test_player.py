"""The `processes` executor's player: plays each run dir it is sent as
`fedsim run --resume RUN_DIR` would, answers its exit code, logs its output."""

from __future__ import annotations

import subprocess
import sys

from fedsim.study.player import PLAYER_ARGS


def test_a_player_answers_each_runs_exit_code_and_appends_its_output_to_the_log(tmp_path):
  runs = [tmp_path / "runs" / "x" / name for name in ("a", "b")]
  for run_dir in runs:
    run_dir.mkdir(parents=True)
  (runs[0] / "config.yaml").write_text("name: x\nrounds: [1\n")  # unreadable YAML: exit 2
  (runs[1] / "config.yaml").write_text("name: x\nrounds: 1\n")  # a key missing: exit 2
  player = subprocess.Popen([sys.executable, *PLAYER_ARGS], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
  out, err = player.communicate(f"{runs[0]}\n{runs[1]}\n{runs[0]}\n", timeout=300)
  assert (player.returncode, out, err) == (0, "2\n2\n2\n", "")
  first = (runs[0] / "output.log").read_text().splitlines()
  assert len(first) == 2 and all(line.startswith("fedsim: error: ") for line in first), first
  second = (runs[1] / "output.log").read_text()
  assert "clients_per_round: missing required key" in second and second.count("\n") == 1, second
