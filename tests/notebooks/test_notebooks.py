"""Executes every tutorial notebook top to bottom in a fresh Jupyter kernel.

Tiny settings come in through the environment variables the notebooks read
(FEDSIM_NOTEBOOK_*), which the kernel inherits. The kernel is the venv's own
Python (`sys.executable -m ipykernel_launcher`) from a kernelspec written to a
temporary directory, so the user's Jupyter configuration and any `python3`
kernelspec installed elsewhere play no part.

Each test also checks that the kernel leaves no TFF `worker_binary` process
behind: those are found by parent (the kernel) and by a marker variable in
their environment, which they inherit from the kernel and keep when they are
re-parented after the kernel exits.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
jupyter_client = pytest.importorskip("jupyter_client")

NOTEBOOKS_DIR = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
KERNEL_NAME = "fedsim-test"
MARKER = "FEDSIM_NOTEBOOK_TEST_MARKER"
CELL_TIMEOUT_S = 300
# Processes killed by PR_SET_PDEATHSIG take a moment to disappear.
EXIT_GRACE_S = 10.0

# The first cell the test adds: Jupyter runs cells inside a running asyncio
# loop, and the notebooks must work there. If a kernel ever stopped doing so,
# this test would no longer cover that case; fail instead.
_LOOP_CHECK = "import asyncio\nasyncio.get_running_loop()"


def _worker_processes(kernel_pid: int, marker: str) -> dict[int, str]:
  """pid -> state of live `worker_binary` processes of this kernel.

  A process counts if its parent is the kernel or its environment holds
  `marker`; zombies count as gone (they are dead, only not yet reaped).
  """
  found = {}
  for entry in pathlib.Path("/proc").iterdir():
    if not entry.name.isdigit():
      continue
    try:
      stat = (entry / "stat").read_text()
      # comm may contain spaces; the fields after its closing ')' do not.
      comm = stat[stat.index("(") + 1:stat.rindex(")")]
      state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
      if "worker_binary" not in comm or state == "Z":
        continue
      ours = int(ppid) == kernel_pid
      if not ours:
        ours = marker.encode() in (entry / "environ").read_bytes()
    except (OSError, ValueError):  # Exited meanwhile, or not ours to read.
      continue
    if ours:
      found[int(entry.name)] = state
  return found


def _wait_for_exit(kernel_pid: int, marker: str) -> dict[int, str]:
  deadline = time.monotonic() + EXIT_GRACE_S
  while True:
    left = _worker_processes(kernel_pid, marker)
    if not left or time.monotonic() > deadline:
      return left
    time.sleep(0.2)


@pytest.fixture
def kernel_manager(tmp_path):
  """A KernelManager for the venv's Python, from a spec in a temporary directory."""
  try:  # What the kernel imports first: a failure here would only say "kernel died".
    import ipykernel.kernelapp  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    pytest.fail(f"the Jupyter kernel cannot start in this environment: {e}")
  spec_dir = tmp_path / "kernels" / KERNEL_NAME
  spec_dir.mkdir(parents=True)
  spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
          "display_name": "fedsim test", "language": "python"}
  (spec_dir / "kernel.json").write_text(json.dumps(spec))
  specs = jupyter_client.kernelspec.KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
  return jupyter_client.KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)


@pytest.mark.slow
@pytest.mark.parametrize("path", [
    # The first notebook in every run; the others on `-m long` (each ~30-45 s).
    pytest.param(p, marks=() if i == 0 else pytest.mark.long) for i, p in enumerate(NOTEBOOKS)],
    ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_leaves_no_worker(path, tmp_path, monkeypatch, kernel_manager):
  marker = uuid.uuid4().hex
  monkeypatch.setenv(MARKER, marker)
  monkeypatch.setenv("FEDSIM_NOTEBOOK_ROUNDS", "2")
  monkeypatch.setenv("FEDSIM_NOTEBOOK_LOGDIR", str(tmp_path / "runs"))
  monkeypatch.setenv("FEDSIM_NOTEBOOK_TENSORBOARD", "0")  # No server to clean up.
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
  monkeypatch.setenv("MPLBACKEND", "agg")

  nb = nbformat.read(path, as_version=4)
  nb.cells.insert(0, nbformat.v4.new_code_cell(_LOOP_CHECK))
  client = nbclient.NotebookClient(
      nb, km=kernel_manager, timeout=CELL_TIMEOUT_S,
      resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
  kernel_pid = None
  try:
    with client.setup_kernel():
      kernel_pid = kernel_manager.provisioner.process.pid
      for index, cell in enumerate(nb.cells):
        client.execute_cell(cell, index)  # Raises CellExecutionError on any error.
      # Each fedsim.run stops its worker when the run ends, kernel or not.
      assert _worker_processes(kernel_pid, marker) == {}, "worker alive after the last cell"
    assert _wait_for_exit(kernel_pid, marker) == {}, "worker outlived the kernel"
  finally:
    if kernel_pid is not None:
      for pid in _worker_processes(kernel_pid, marker):
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass

  runs = list((tmp_path / "runs").rglob("metrics.csv"))
  assert runs, "the notebook wrote no run"
  for metrics in runs:
    assert (metrics.parent / "status").read_text().startswith("completed")
    assert len(metrics.read_text().splitlines()) == 1 + 2  # header + FEDSIM_NOTEBOOK_ROUNDS


def test_notebooks_are_stored_without_outputs():
  assert [p.name for p in NOTEBOOKS] == [
      "01_quickstart.ipynb", "02_compression.ipynb", "03_algorithms.ipynb"]
  for path in NOTEBOOKS:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
      if cell.cell_type == "code":
        assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: {cell.id}"


def test_worker_scan_finds_marked_processes_only(tmp_path):
  # A stand-in named like TFF's worker: the leak check above is only as good
  # as this scan.
  fake = tmp_path / "worker_binary"
  fake.symlink_to("/bin/sleep")
  marker = uuid.uuid4().hex
  env = dict(os.environ, **{MARKER: marker})
  unmarked = subprocess.Popen([str(fake), "30"], env=dict(os.environ))
  marked = subprocess.Popen([str(fake), "30"], env=env)
  try:
    found = _worker_processes(kernel_pid=-1, marker=marker)
    assert marked.pid in found and unmarked.pid not in found
    assert unmarked.pid in _worker_processes(kernel_pid=os.getpid(), marker=marker)
  finally:
    for process in (marked, unmarked):
      process.kill()
      process.wait()
  # Other workers of this process (e.g. the session fixture's) may exist.
  left = _worker_processes(kernel_pid=os.getpid(), marker=marker)
  assert marked.pid not in left and unmarked.pid not in left


PAGES = NOTEBOOKS_DIR.parent / "docs" / "notebooks"


def _execute_notebooks():
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      "execute_notebooks", NOTEBOOKS_DIR.parent / "docs" / "execute_notebooks.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_rendered_pages_show_runs_not_the_temporary_directory_they_ran_in():
  pages = sorted(PAGES.glob("*.ipynb"))
  assert [p.name for p in pages] == [p.name for p in NOTEBOOKS]
  shown = []
  for page in pages:
    text = page.read_text()
    assert "/tmp/" not in text and "fedsim-notebooks-" not in text, page.name
    shown += [line for c in nbformat.read(page, as_version=4).cells
              for o in c.get("outputs", []) for line in "".join(o.get("text", "")).splitlines()
              if line.startswith("run dir: ")]
  assert shown and all(line.startswith("run dir: runs/") for line in shown), shown


def test_stable_paths_replaces_the_logdir_in_text_outputs_only():
  execute = _execute_notebooks()
  logdir = "/tmp/fedsim-notebooks-abc123"
  notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=[
      nbformat.v4.new_output("stream", name="stdout", text=f"run dir: {logdir}/q/1\n"),
      nbformat.v4.new_output("execute_result", execution_count=1, data={
          "text/plain": f"PosixPath('{logdir}/q')", "image/png": f"{logdir}AAAA"}),
      nbformat.v4.new_output("error", ename="E", evalue=f"no {logdir}/x",
                             traceback=[f"at {logdir}/y"])])])
  execute.stable_paths(notebook, logdir)
  stream, result, error = notebook.cells[0].outputs
  assert stream.text == "run dir: runs/q/1\n"
  assert result.data["text/plain"] == "PosixPath('runs/q')"
  assert result.data["image/png"] == f"{logdir}AAAA"
  assert (error.evalue, error.traceback) == ("no runs/x", ["at runs/y"])
  nbformat.validate(notebook)
