"""The `ray` executor: each run of a study a Ray task; Ctrl-C and a lost node
leave every run resumable, and the runs equal their sequential runs bit for bit.

The study is test_interrupted_study's `sgd` variant (3 seeds x 3 rounds); its
reference is the same study played sequentially in one process.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from fedsim.errors import UserError
from fedsim.reporting.ownership import wait_released
from fedsim.reporting.rundir import read_status
from fedsim.study.executors import ExecutorChoice, choose
from fedsim.study import on_ray
from fedsim.study.on_ray import run_resources
from tests.chaos.processes import MARKER, kill_marked, left_after, marked
from tests.ray_cluster import RAY, _free_port, _ours, _release_fedsims_actors, _stop
from tests.study.test_interrupted_study import (CONFIG, TIMEOUT_S, _assert_equal_studies,
                                                _ctrl_c_through_uv, _fedsim, _lines,
                                                _reference, _start)

RUNS = [f"sgd-seed{s}" for s in range(3)]


@pytest.mark.parametrize("args, error", [
    (("threads", 1, None, None), "--executor: unknown executor 'threads'; choose one of:"
                                 " sequential, processes, ray"),
    (("ray", 2, None, None), "--jobs: only with --executor processes (the ray executor runs as"
                             " many runs at once as the cluster's CPUs hold)"),
    (("sequential", 2, None, None), "--jobs: only with --executor processes (the sequential"
                                    " executor plays one run at a time)"),
    ((None, 1, "auto", None), "--ray-address: only with --executor ray"),
    (("processes", 2, None, 3), "--max-retries: only with --executor ray"),
    (("ray", 1, "head:port", None), "--ray-address: 'head:port' is not local, auto or HOST:PORT"),
    (("ray", 1, None, -1), "--max-retries: -1 is not a number of retries (0 or more)"),
])
def test_executor_flags_are_checked_in_one_line(args, error):
  with pytest.raises(UserError) as raised:
    choose(*args)
  assert str(raised.value) == error


def test_the_executor_chosen_and_its_defaults():
  assert choose(None, 1) == ExecutorChoice("sequential", 1, "local", 2)
  assert choose(None, 3) == ExecutorChoice("processes", 3, "local", 2)
  assert choose("ray", 1, "10.0.0.1:6379", 0) == ExecutorChoice("ray", 1, "10.0.0.1:6379", 0)


@pytest.mark.parametrize("runtime, want", [
    (None, {"num_cpus": 1.0, "num_gpus": 0.0}),
    ({"name": "inprocess", "device": "gpu"}, {"num_cpus": 1.0, "num_gpus": 1.0}),
    ({"name": "ray"}, {"num_cpus": 2.0, "num_gpus": 0.0}),  # its 2 actors of 1 CPU
    ({"name": "ray", "workers": 3, "cpus_per_worker": 2, "gpus_per_worker": 0.5},
     {"num_cpus": 6.0, "num_gpus": 1.5}),
    ({"name": "ray", "address": "auto", "workers": 3}, {"num_cpus": 1.0, "num_gpus": 0.0}),
])
def test_a_run_asks_ray_for_what_its_config_declares(runtime, want):
  assert run_resources({"rounds": 3, **({"runtime": runtime} if runtime else {})}) == want


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> pathlib.Path:
  """The sgd variant's 3 runs, sequential, in this process."""
  return _reference(tmp_path_factory.mktemp("reference"), CONFIG, "--variant", "sgd")


def _marked(args: list[str], marker: str) -> subprocess.Popen:
  os.environ[MARKER] = marker  # inherited by the Ray nodes and the runs' processes
  try:
    return _start([sys.executable, "-m", "fedsim.cli", "run", *args, "--no-progress"])
  finally:
    del os.environ[MARKER]


def _assert_only_fedsims(stderr: str) -> None:
  """Every line of `stderr` is fedsim's (none of Ray's own)."""
  assert all(line.startswith("fedsim: ") for line in stderr.splitlines()), stderr


def _statuses(study: pathlib.Path) -> list[str]:
  return [(study / run / "status").read_text().split("\n")[0]
          if (study / run / "status").is_file() else "-" for run in RUNS]


@pytest.mark.slow
def test_ctrl_c_leaves_a_ray_study_resumable_and_nothing_behind_and_it_ends_as_sequential(
    reference, ray_cluster, tmp_path):
  """Ctrl-C on a study on a private Ray instance; the printed command then
  resumes it on the session's cluster (`--ray-address`): a second private
  instance would start and stop as the first did."""
  (tmp_path / "proof.yaml").write_text(CONFIG)
  study = tmp_path / "runs" / "proof"
  marker = uuid.uuid4().hex
  process = _marked([str(tmp_path / "proof.yaml"), "--variant", "sgd", "--logdir",
                     str(tmp_path / "runs"), "--executor", "ray"], marker)
  try:
    deadline = time.monotonic() + TIMEOUT_S
    while (process.poll() is None and time.monotonic() < deadline
           and not any(_lines(study / run / "metrics.csv") > 1 for run in RUNS)):
      time.sleep(0.05)  # until a run logged a round: its task and child are busy
    assert process.poll() is None, process.communicate()
    # Ray's workers run this Python: not `uv run` in a copy of this directory,
    # which Ray arranges when `uv run` started the study (as it starts the suite).
    assert [c for _, c in marked(marker) if os.path.basename(c.split()[0]) == "uv"] == []
    _ctrl_c_through_uv(process)
    out, err = process.communicate(timeout=60)
    # Every run's process ends with the study. The study waits for them only
    # within its exit deadline (on_ray._CANCEL_S, _ENDED_S): on a loaded machine
    # (the suite's other worker busy) a run's process has been seen ending after
    # the study, so a resume may have to wait seconds, not more.
    assert wait_released([study / run for run in RUNS], 10) == []
  finally:
    kill_marked(marker)
  assert process.returncode == 130, err
  assert "interrupted again" not in err and "Traceback" not in err, err
  _assert_only_fedsims(err)
  assert re.findall(r"^started (\S+) ", out, re.M) == RUNS  # all submitted at once
  assert left_after(marker, 15) == []  # no Ray process, no run's child
  statuses = _statuses(study)  # stopped, finished in the meantime, or never started
  assert set(statuses) <= {"interrupted", "completed", "-"} and statuses.count("completed") < 3
  match = re.fullmatch(r"fedsim: interrupted; resume with: (.*)", err.strip().splitlines()[-1])
  assert match, err
  command = shlex.split(match.group(1))
  assert command[-3:] == ["run", "--resume", str(study)], command
  address, _ = ray_cluster
  _release_fedsims_actors()  # idle actors of earlier modules would hold the nodes' CPUs
  resumed = _fedsim("--resume", str(study), "--executor", "ray", "--ray-address", address)
  _, err = resumed.communicate(timeout=TIMEOUT_S)
  assert resumed.returncode == 0, err
  _assert_equal_studies(study, reference, RUNS)


NODE_IP = "127.0.0.2"  # the second node's own loopback address
ROUNDS = 60  # of the two-node study's runs


@pytest.fixture(params=["head", "node"])
def two_nodes(request):
  """('127.0.0.1:PORT' of a head and a second node (at NODE_IP) of one CPU
  each, the node a driver started afterwards attaches to: 'head' or 'node')."""
  temp_dir = tempfile.mkdtemp(prefix="fsst", dir="/tmp")
  # As fedsim's private instance (fedsim.study.on_ray), with a raylet patient
  # with slow agents too (it exits when they take over 30 s to start).
  env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_enable_metrics_collection": "0",
         "RAY_agent_register_timeout_ms": "300000", **on_ray._PRIVATE_INSTANCE}
  port = _free_port()
  common = ["--num-cpus", "1", "--disable-usage-stats"]
  try:
    subprocess.run([RAY, "start", "--head", "--port", str(port), "--include-dashboard=false",
                    "--temp-dir", temp_dir, "--node-ip-address", "127.0.0.1", *common],
                   env=env, check=True, capture_output=True, timeout=180)
    # Ray takes 127.0.0.1 for the machine's address, and a second node on the
    # same address would be as likely as the head to get the driver.
    address_file = pathlib.Path(temp_dir, "session_latest", "node_ip_address.json")
    head_address = address_file.read_text()
    subprocess.run([RAY, "start", "--address", f"127.0.0.1:{port}", "--node-ip-address",
                    NODE_IP, *common], env=env, check=True, capture_output=True, timeout=180)
    # Nodes on one machine share the head's session directory, where each
    # node started writes its address and a driver reads the one it attaches
    # to: on two machines each node has its own, and the study's driver sits
    # on the head's machine.
    assert NODE_IP in address_file.read_text()
    if request.param == "head":
      address_file.write_text(head_address)
    yield f"127.0.0.1:{port}", request.param
  finally:
    _stop(temp_dir, port)  # both nodes: the second one's processes name the same dir
    shutil.rmtree(temp_dir, ignore_errors=True)
  assert _ours(temp_dir, port) == []


def _raylet(address: str) -> int:
  """The pid of the second node's raylet."""
  port = address.rsplit(":", 1)[1]
  found = subprocess.run(["pgrep", "-af", f"/raylet/raylet .*--node_ip_address={NODE_IP} "],
                         capture_output=True, text=True).stdout.splitlines()
  found = [line for line in found if re.search(f"--gcs-address=[^ ]*:{port} ", line)]
  assert len(found) == 1, found
  return int(found[0].split()[0])


def _driver_address(address: str, pid: int) -> str | None:
  """The node address of the Ray driver whose process is `pid` (None: not connected)."""
  from ray._private.state import GlobalState  # pylint: disable=g-import-not-at-top
  from ray._raylet import GcsClientOptions  # pylint: disable=g-import-not-at-top
  state = GlobalState()
  state._initialize_global_state(GcsClientOptions.create(
      address, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False))
  try:
    return next((job["DriverIPAddress"] for job in state.job_table()
                 if job["DriverPid"] == pid and not job["IsDead"]), None)
  finally:
    state.disconnect()


def _run_on(raylet: int) -> tuple[list[int], pathlib.Path | None]:
  """The node's processes (its raylet and every descendant), and the run
  directory its task plays (one pass over /proc: the run can end while
  the test looks)."""
  parents: dict[int, list[int]] = {}
  for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
      continue
    parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
  pids, run_dir = [], None
  todo = [raylet]
  while todo:
    pid = todo.pop()
    pids.append(pid)
    todo.extend(parents.get(pid, []))
    try:
      args = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
      continue
    if b"--resume" in args:
      run_dir = pathlib.Path(args[args.index(b"--resume") + 1].decode())
  return pids, run_dir


def _signal(pids: list[int], sig: int) -> None:
  for pid in pids:
    try:
      os.kill(pid, sig)
    except ProcessLookupError:
      pass


@pytest.mark.slow
@pytest.mark.long
def test_a_run_whose_node_dies_resumes_on_the_other_and_the_study_equals_sequential(
    two_nodes, tmp_path):
  """With the study's driver on the head (as on a real cluster, where it runs on
  its own machine), the killed node's run resumes on the head; with the driver
  on the killed node, no run can go on: every run not completed fails at once,
  and the printed command continues the study on the head."""
  address, driver_on = two_nodes
  # ROUNDS: 3 rounds of these tiny runs can end before the node is caught mid-run.
  (tmp_path / "proof.yaml").write_text(CONFIG.replace("\nrounds: 3\n", f"\nrounds: {ROUNDS}\n"))
  reference = _fedsim(str(tmp_path / "proof.yaml"), "--variant", "sgd", "--logdir",
                      str(tmp_path / "reference"))
  _, err = reference.communicate(timeout=TIMEOUT_S)
  assert reference.returncode == 0, err
  reference = tmp_path / "reference" / "proof"
  study = tmp_path / "runs" / "proof"
  ray_args = ("--executor", "ray", "--ray-address", address)
  process = _fedsim(str(tmp_path / "proof.yaml"), "--variant", "sgd", "--logdir",
                    str(tmp_path / "runs"), *ray_args)
  try:
    raylet = _raylet(address)
    deadline = time.monotonic() + TIMEOUT_S
    driver = None
    while driver is None and process.poll() is None and time.monotonic() < deadline:
      time.sleep(0.5)
      driver = _driver_address(address, process.pid)
    assert driver is not None and (driver == NODE_IP) == (driver_on == "node"), driver
    killed, spared = False, set()
    while process.poll() is None and time.monotonic() < deadline and not killed:
      pids, run_dir = _run_on(raylet)
      if (run_dir is None or run_dir in spared
          or not any((run_dir / "checkpoints").glob("round_*"))):
        time.sleep(0.05)
        continue  # no run on the node with a checkpoint to resume from yet
      # Frozen, the node's run is mid-run for sure or already completed (all its
      # rounds logged): the node dies in the first case and is let go in the second.
      _signal(pids, signal.SIGSTOP)
      if read_status(run_dir)[0] == "completed" or _lines(run_dir / "metrics.csv") > ROUNDS:
        spared.add(run_dir)
        _signal(pids, signal.SIGCONT)
        continue
      _signal(pids, signal.SIGKILL)  # the node dies: raylet, workers, the run's child
      killed = True
    assert killed, (spared, process.communicate())
    out, err = process.communicate(timeout=TIMEOUT_S)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.communicate()
  # The study ran over a minute: over the 30 s after which Ray's core worker
  # logs that it found no metrics agent.
  _assert_only_fedsims(err)
  if driver_on == "node":
    assert process.returncode == 1, err
    failed = re.findall(r"^fedsim: run failed: (\S+): lost the Ray node this study is attached"
                        r" to \(node \w{8}\); the run can resume from its last checkpoint$",
                        err, re.M)
    assert run_dir.name in failed, err
    assert all(read_status(study / run)[0] == "completed" for run in RUNS if run not in failed)
    assert wait_released([study / run for run in RUNS], 0) == []
    resumed = _fedsim("--resume", str(study), *ray_args)
    _, err = resumed.communicate(timeout=TIMEOUT_S)
    assert resumed.returncode == 0, err
  else:
    assert process.returncode == 0, err
  log = (run_dir / "output.log").read_text()
  assert re.search(rf"^resuming \S+ after round \d+ of {ROUNDS}$", log, re.M), log
  _assert_equal_studies(study, reference, RUNS, rounds=ROUNDS)
