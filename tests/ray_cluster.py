"""The two-node Ray cluster on loopback that the Ray modules share (the `ray`
xdist group runs them on one worker, so the session starts it once: Ray nodes
take tens of seconds to start on two cores). Its teardown ends fedsim's
connection to it (actors that runs left for the next run included), then
checks that it left no Ray process and no fedsim actor behind."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RAY = str(pathlib.Path(sys.executable).parent / "ray")
# An actor of test_cluster's `DyingWorker` exits once this file exists, after
# renaming it (only one can).
ARMED = "FEDSIM_TEST_DIE_ARMED"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _ours(temp_dir: str, port: int) -> list[str]:
  """Command lines of live processes of the cluster in `temp_dir` (raylet, GCS, ...)
  or of its GCS at `port` (Ray's client server names only the GCS address)."""
  pattern = f"{temp_dir}|:{port}([^0-9]|$)"
  found = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
  return [line for line in found.splitlines() if "pgrep" not in line]


def _stop(temp_dir: str, port: int) -> None:
  """Ends this cluster's processes by pid (`ray stop` would end every Ray on the machine)."""
  for sig in (signal.SIGTERM, signal.SIGKILL):
    for line in _ours(temp_dir, port):
      try:
        os.kill(int(line.split()[0]), sig)
      except ProcessLookupError:
        pass
    deadline = time.monotonic() + 2  # Ray's agents ignore SIGTERM: SIGKILL follows
    while _ours(temp_dir, port) and time.monotonic() < deadline:
      time.sleep(0.2)


def _release_fedsims_actors() -> None:
  """Ends what runs left on the cluster (`fedsim.runtime.cluster.release`) and
  waits for their actors' processes to exit (ray.kill returns before they do)."""
  from fedsim.runtime.cluster import pool
  pids = []
  if pool.idle_actors():
    import ray
    try:
      pids = ray.get([actor.pid.remote() for actor in pool.idle_actors()], timeout=30)
    except Exception:  # pylint: disable=broad-except
      pass  # dead already, or the cluster is gone
  pool.release()
  deadline = time.monotonic() + 60
  while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
    time.sleep(0.2)


@contextlib.contextmanager
def loopback_cluster() -> Iterator[tuple[str, str, int]]:
  """('127.0.0.1:PORT', its temp dir, PORT) of a head node and a second node,
  one CPU each, on loopback; stopped at the end (fedsim's connection to it first)."""
  temp_dir = tempfile.mkdtemp(prefix="fsray", dir="/tmp")  # short: Ray's socket paths
  env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0",
         "RAY_enable_metrics_collection": "0", ARMED: os.path.join(temp_dir, "armed")}
  port = _free_port()
  # No autoscaler monitor and no log monitors (fedsim connects with
  # log_to_driver off): without them the two nodes' start took ~23 s of CPU
  # instead of ~30, and the idle cluster 0.02 cores instead of 0.03.
  common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--temp-dir", temp_dir,
            "--disable-usage-stats", "--include-log-monitor=false"]
  try:
    subprocess.run([RAY, "start", "--head", "--port", str(port), "--include-dashboard=false",
                    "--no-monitor", *common], env=env, check=True, capture_output=True,
                   timeout=120)
    subprocess.run([RAY, "start", "--address", f"127.0.0.1:{port}", *common], env=env,
                   check=True, capture_output=True, timeout=120)
    yield f"127.0.0.1:{port}", temp_dir, port
  finally:
    _release_fedsims_actors()  # else this process stays connected to the stopped cluster
    _stop(temp_dir, port)
    shutil.rmtree(temp_dir, ignore_errors=True)  # Ray's sessions and logs


# The session's cluster while it is up: (its stack, temp dir, GCS port).
_running: list[tuple[contextlib.ExitStack, str, int]] = []


@pytest.fixture(scope="session")
def ray_cluster():
  """'127.0.0.1:PORT' of a head node and a second node, one CPU each."""
  stack = contextlib.ExitStack()
  address, temp_dir, port = stack.enter_context(loopback_cluster())
  _running.append((stack, temp_dir, port))
  yield address, temp_dir
  end_ray_cluster()


def end_ray_cluster() -> None:
  """Stops the session's cluster, if up, and checks that it left no Ray process
  and no fedsim actor. tests/conftest.py calls it after the Ray group's last
  test: its daemons take CPU while they idle, and the group's worker goes on
  with other modules."""
  while _running:
    stack, temp_dir, port = _running.pop()
    stack.close()
    assert _ours(temp_dir, port) == []
    assert _actors_of(temp_dir) == []


def _actors_of(temp_dir: str) -> list[int]:
  """Live fedsim actors of the cluster in `temp_dir`: their environment, inherited
  from its nodes, names it (another Ray on the machine has actors of its own)."""
  found = subprocess.run(["pgrep", "-f", "ray::(DyingWorker|ClientWorker)"],
                         capture_output=True, text=True).stdout.split()
  ours = []
  for pid in found:
    try:
      environment = pathlib.Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
      continue  # ended meanwhile
    if temp_dir.encode() in environment:
      ours.append(int(pid))
  return ours
