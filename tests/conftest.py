"""Suite-wide fixtures. Tests that execute TFF computations take `tff_runtime`,
which runs them on one fedsim-owned worker for the whole session."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

# TFF's DP packages run at first use, as in `fedsim run` (fedsim/backend/lazy_imports.py),
# also for test modules that import TFF themselves: the DP tests check that path.
from fedsim.backend import lazy_imports  # noqa: E402

lazy_imports.defer()

# The Ray modules' one cluster.
from tests.ray_cluster import end_ray_cluster, ray_cluster  # noqa: E402,F401


@pytest.fixture(scope="session")
def tff_runtime(tmp_path_factory):
  from fedsim import runtime
  from fedsim.runtime.session import session
  runtime.install_guard()
  log = tmp_path_factory.mktemp("tff-worker") / "worker.log"
  with session(str(log)) as w:
    yield w


@pytest.fixture(autouse=True)
def _tff_guard():
  """Once a test module has imported TFF, computations called outside a run
  or `tff_runtime` start a fedsim-owned worker, never TFF's own (which would
  outlive pytest and hold its pipes). Importing TFF costs ~10 s, so it is not
  imported here for tests that do not need it."""
  if "tensorflow_federated" in sys.modules:
    from fedsim import runtime
    runtime.install_guard()
  yield


@pytest.fixture
def lock_holder():
  """lock_holder(run_dir) -> a process holding the directory's lock (see
  fedsim.reporting.ownership), killed at the end."""
  hold = ("import sys, time\n"
          "from fedsim.reporting.ownership import lock_run_dir\n"
          "lock = lock_run_dir(sys.argv[1])\n"
          "print('locked', flush=True)\n"
          "time.sleep(600)\n")
  children = []

  def start(run_dir):
    child = subprocess.Popen([sys.executable, "-c", hold, str(run_dir)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    children.append(child)
    assert child.stdout.readline() == "locked\n"
    return child

  yield start
  for child in children:
    child.kill()
    child.wait()
    child.stdout.close()


# Modules that start Ray (a cluster of their own, or fedsim's private instance):
# one xdist worker runs them one after another, since their checks for leftover
# Ray processes look at the whole machine.
RAY_MODULES = frozenset({"tests/runtime/test_cluster.py", "tests/chaos/test_ray_faults.py",
                         "tests/compression/test_tff_chain_runs.py",
                         "tests/compression/test_tff_stages.py",
                         "tests/study/test_ray_executor.py"})


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
  """Leaves out `long` tests unless a -m expression is given (`-m long` runs them,
  `-m "long or not long"` everything), and groups the tests for xdist's
  `loadgroup`: a module's tests go to one worker (they share its module
  fixtures), the Ray modules all to one. Groups are handed out in the order
  they come (`--no-loadscope-reorder`), so the longest go first: the Ray group
  (minutes, on one worker), then by their end-to-end (`slow`) tests, so a long
  group never starts last while the other workers idle."""
  for item in items:
    module = item.nodeid.split("::", 1)[0]
    item.add_marker(pytest.mark.xdist_group("ray" if module in RAY_MODULES else module))
  if not config.option.markexpr:
    kept = [item for item in items if item.get_closest_marker("long") is None]
    if len(kept) != len(items):
      config.hook.pytest_deselected(items=[i for i in items if i not in kept])
      items[:] = kept
  cost: dict[str, float] = {}
  for item in items:
    group = item.get_closest_marker("xdist_group").args[0]
    cost[group] = cost.get(group, 0.0) + (10.0 if item.get_closest_marker("slow") else 0.5)
  cost["ray"] = float("inf")
  items.sort(key=lambda item: -cost[item.get_closest_marker("xdist_group").args[0]])


@pytest.hookimpl(trylast=True)  # after the test's own fixtures ended
def pytest_runtest_teardown(item, nextitem):
  """Stops the Ray modules' cluster after the last of them (they run one after
  another, first: `pytest_collection_modifyitems`), not at the session's end."""
  group = lambda test: test.get_closest_marker("xdist_group").args[0]
  if group(item) == "ray" and (nextitem is None or group(nextitem) != "ray"):
    end_ray_cluster()


def pytest_sessionfinish(session, exitstatus):
  """Drops TFF's own default context while modules are intact, so its
  finalizer prints no traceback at interpreter exit."""
  del session, exitstatus
  if "tensorflow_federated" in sys.modules:
    from fedsim.backend import contexts
    contexts.drop_default()


class SmallDisk:
  """A tmpfs of a few MiB for disk-full tests; `fill()` takes all its free space."""

  def __init__(self, path):
    self.path = path
    self._filler = path / ".filler"

  def fill(self) -> None:
    fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    chunk = 1 << 20
    try:
      while chunk:
        try:
          os.write(fd, b"\0" * chunk)
        except OSError as e:
          if e.errno != errno.ENOSPC:
            raise
          chunk //= 2
    finally:
      os.close(fd)

  def free(self) -> None:
    self._filler.unlink()


@pytest.fixture
def small_disk(tmp_path):
  """A SmallDisk of 8 MiB mounted under tmp_path; skips unless mounting is permitted."""
  path = tmp_path / "disk"
  path.mkdir()
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(path)],
                           capture_output=True, check=False)
  if mounted.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
  try:
    yield SmallDisk(path)
  finally:
    subprocess.run(["umount", "-l", str(path)], check=False)
