"""The `ray` executor: each run of a study a Ray task on a cluster.

A run's task starts `fedsim run --resume RUN_DIR` as a child process on the
node it lands on (`executors.start_child`), the same code path every executor
uses, so the run equals its sequential run bit for bit; and a child is stopped
as Ctrl-C stops a run (SIGINT, then a second one), leaving it resumable,
which a Python call inside the task could not promise.

* Resources: a task asks Ray for what its run declares (`run_resources`):
  1 CPU, a GPU with `runtime.device: gpu`, and for a run on a private `ray`
  runtime its actors' CPUs and GPUs (they run on the task's node). Ray
  reserves them; it does not pin: TensorFlow still sees the node's cores.
* Lost runs: the child dies with its task's worker (SIGTERM, status
  'interrupted'); a run whose worker or node was lost, or whose child a
  signal ended, is sent again (`max_retries` times, `_RETRY_AFTER_S` x its
  tries later: Ray may still place it on the dead node until it notices),
  to any node with room, and the new child resumes from its last checkpoint.
  Run directories must therefore be on a filesystem every node mounts at the
  same path. When the node this process is attached to dies, no task can be
  sent or answered: every run not completed fails at once, resumable.
* Ctrl-C: every task is cancelled (Ray raises KeyboardInterrupt in it, and
  it stops its child), the tasks are given `_CANCEL_S` to end, then a private
  instance is shut down and its processes swept (`runtime.cluster.pool.connect`);
  a run's process is not the instance's: it ends by itself, 'interrupted',
  and the study waits for it, so a resume started at once finds the run free.
"""

from __future__ import annotations

import os
import pathlib
import socket
import time
from typing import Any, Iterator, Mapping, Sequence

import yaml

from fedsim.errors import UserError
from fedsim.reporting.ownership import wait_released
from fedsim.runtime.cluster.address import answers
from fedsim.runtime.cluster.failures import first_line
from fedsim.runtime.cluster.pool import connect
from fedsim.study.executors import (Outcome, StudyContext, child_outcome, completed,
                                    start_child, stop_children, stopped)
from fedsim.study.plan import PlannedRun

_PROBE_S = 5.0   # how often a wait checks that the cluster still answers
_RETRY_AFTER_S = 10.0  # a lost run starts again after this, times its tries so far
# Cancelled tasks stop their children (`executors.stop_children`); the study
# waits `_CANCEL_S` for them, then disconnects (a private instance stops), and a
# child still stopping gets SIGTERM as its worker dies and ends 'interrupted';
# the study waits `_ENDED_S` more for those (their run directories' locks),
# all within its own exit deadline (fedsim.runtime.signals.EXIT_DEADLINE_S).
_CANCEL_S = 4.0
_ENDED_S = 2.5
# A private instance's raylet: its workers at niceness 0 (Ray's 15, inherited
# by each run's process, starves the runs on a busy machine), and patient with
# a worker whose start (Python, Ray's import) takes over Ray's 60 s, as it did
# on two cores under a load of 27: the raylet kept starting workers in vain.
_PRIVATE_INSTANCE = {"RAY_worker_niceness": "0", "RAY_worker_register_timeout_seconds": "600"}


class RunLost(Exception):
  """A run's child was ended by a signal its task did not send (its node is
  going down, the kernel's OOM killer, a person): Ray retries the task."""


def play_run(run_dir: str, plugins: Sequence[str], cwd: str) -> tuple[int, str]:
  """In a Ray worker: plays one run as a child process.

  Returns:
    (the child's exit code, this node's host name).

  Raises:
    RunLost: a signal ended the child.
    KeyboardInterrupt: the task was cancelled (its child stopped resumable).
  """
  os.chdir(cwd)  # where `--plugin` paths and relative data paths are found
  child = start_child(pathlib.Path(run_dir), plugins)
  try:
    code = child.wait()
  except BaseException:
    stop_children([child])
    raise
  host = socket.gethostname()
  if code < 0 or stopped(code):
    raise RunLost(f"its process on {host} was ended by a signal (exit code {code})")
  return code, host


def run_resources(config: Mapping[str, Any]) -> dict[str, float]:
  """Ray's `num_cpus` and `num_gpus` for a run of `config` (its config.yaml)."""
  runtime = config.get("runtime") or {}
  if not isinstance(runtime, Mapping):
    runtime = {"name": runtime}
  if runtime.get("name") == "ray" and runtime.get("address", "local") == "local":
    from fedsim.runtime.builtin import RayParams  # TF-free: the keys' defaults
    defaults = RayParams()
    workers = runtime.get("workers", defaults.workers)
    return {"num_cpus": workers * runtime.get("cpus_per_worker", defaults.cpus_per_worker),
            "num_gpus": workers * runtime.get("gpus_per_worker", defaults.gpus_per_worker)}
  return {"num_cpus": 1.0, "num_gpus": 1.0 if runtime.get("device") == "gpu" else 0.0}


class OnRay:
  """Every run a Ray task (see the module docstring)."""

  def __init__(self, address: str, max_retries: int):
    self._address = address
    self._max_retries = max_retries

  def play(self, runs: Sequence[PlannedRun], context: StudyContext) -> Iterator[Outcome]:
    if not runs:
      return
    resources = [run_resources(_config(run)) for run in runs]
    need_cpus = max(r["num_cpus"] for r in resources)
    need_gpus = max(r["num_gpus"] for r in resources)
    added = {k: v for k, v in _PRIVATE_INSTANCE.items()
             if self._address == "local" and k not in os.environ}
    os.environ.update(added)  # read by the raylet ray.init starts
    try:
      reaper = connect(self._address, "--ray-address",
                       num_cpus=max(need_cpus, len(os.sched_getaffinity(0))), num_gpus=need_gpus)
    finally:
      for key in added:
        del os.environ[key]
    import ray  # pylint: disable=g-import-not-at-top
    pending: dict = {}  # task -> (run, its resources, tries so far)
    stopping: list = []  # directories of runs whose process may still be ending
    later: list = []    # (when, run, resources, tries): lost runs to start again
    try:
      self._check_fits(ray, need_cpus, need_gpus)
      gcs = ray.get_runtime_context().gcs_address
      task = ray.remote(play_run)

      def submit(run: PlannedRun, needs: dict, tries: int) -> None:
        ref = task.options(**needs, max_retries=0).remote(
            str(run.run_dir.resolve()), tuple(context.plugins), os.getcwd())
        pending[ref] = (run, needs, tries)

      own_node = ray.get_runtime_context().get_node_id()
      for run, needs in zip(runs, resources):
        submit(run, needs, 1)
        context.on_start(run)
      while pending or later:
        due = [entry for entry in later if entry[0] <= time.monotonic()]
        for entry in due:
          later.remove(entry)
          submit(*entry[1:])
        ready = []
        if pending:
          ready, _ = ray.wait(list(pending), num_returns=1, timeout=_PROBE_S)
        else:
          time.sleep(1.0)  # only runs waiting to start again
        if not ready and not answers(gcs):
          for run, _, _ in list(pending.values()) + [entry[1:] for entry in later]:
            yield Outcome(run, False, error=f"lost the Ray cluster (its head {gcs} stopped"
                                            " answering); the run can resume")
          pending.clear()
          later.clear()
        for ref in ready:
          run, needs, tries = pending.pop(ref)
          outcome, lost = self._outcome(ray, ref, run, tries)
          if lost and (outcome is None or not _alive(ray, own_node)):
            # Every task is sent and answered through this process's own node:
            # none can run, or be sent again, without it.
            lost_runs = [run, *(r for r, _, _ in pending.values()), *(e[1] for e in later)]
            stopping = [r.run_dir for r in lost_runs]  # still running elsewhere, maybe
            for lost_run in lost_runs:
              yield (Outcome(lost_run, True) if completed(lost_run) else Outcome(
                  lost_run, False, error=f"lost the Ray node this study is attached to (node"
                                         f" {own_node[:8]}); the run can resume from its last"
                                         " checkpoint"))
            pending.clear()
            later.clear()
            break
          if lost and completed(run):  # its node went down after the run completed
            yield Outcome(run, True)
          elif lost and tries <= self._max_retries:
            # Ray may place a task on a node it has not yet noticed is dead:
            # start it again once the cluster had time to notice.
            later.append((time.monotonic() + _RETRY_AFTER_S * tries, run, needs, tries + 1))
          else:
            yield outcome
    except BaseException:
      stopping = [run.run_dir for run, _, _ in pending.values()]
      _cancel(ray, list(pending))
      raise
    finally:
      if ray.is_initialized():
        ray.shutdown()
      if reaper is not None:
        reaper.sweep()
      # A resume started as soon as the study has exited must not find a run
      # still held by its process (a task's worker ends, and with it the run's
      # process, once this process has disconnected).
      wait_released(stopping, _ENDED_S)

  def _check_fits(self, ray, cpus: float, gpus: float) -> None:
    """UserError when no node could ever hold a run (its task would wait forever)."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if not any(n.get("CPU", 0) >= cpus and n.get("GPU", 0) >= gpus for n in nodes):
      raise UserError(f"--ray-address: a run needs {cpus:g} CPUs and {gpus:g} GPUs on one"
                      f" node; no node of the cluster at {self._address} has them")

  def _outcome(self, ray, ref, run: PlannedRun, tries: int) -> tuple[Outcome | None, bool]:
    """How `run`'s task ended (None: this process's own Ray node died under
    it), and whether its run was lost (to be started again)."""
    try:
      code, _ = ray.get(ref)
    except ray.exceptions.RayTaskError as e:  # RunLost, or fedsim's own bug
      lost = isinstance(e.cause, RunLost)
      return Outcome(run, False, error=f"{'lost' if lost else 'failed'} {tries} times:"
                                       f" {first_line(e.cause or e)}; the run can resume"
                                       " from its last checkpoint"), lost
    except ray.exceptions.LocalRayletDiedError:  # this process's node: see `play`
      return None, True
    except ray.exceptions.RayError as e:  # its worker or node lost
      return Outcome(run, False, error=f"its Ray worker was lost {tries} times"
                                       f" ({type(e).__name__}); the run can resume from its"
                                       " last checkpoint"), True
    return child_outcome(run, code), False


def _alive(ray, node_id: str) -> bool:
  """Whether the cluster's GCS lists node `node_id` as alive."""
  try:
    return any(node["NodeID"] == node_id and node["Alive"] for node in ray.nodes())
  except Exception:  # pylint: disable=broad-except
    return True  # the GCS did not answer: the study's probe of it says so


def _cancel(ray, refs: list) -> None:
  """Cancels `refs` (each task stops its child resumable) and waits for them."""
  if not refs or not ray.is_initialized():
    return
  for ref in refs:
    try:
      ray.cancel(ref, force=False)
    except Exception:  # pylint: disable=broad-except
      pass  # already ended
  try:
    ray.wait(refs, num_returns=len(refs), timeout=_CANCEL_S)
  except Exception:  # pylint: disable=broad-except
    pass  # the cluster is gone: nothing left to wait for


def _config(run: PlannedRun) -> Mapping[str, Any]:
  try:
    return yaml.safe_load((run.run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
  except (OSError, yaml.YAMLError) as e:
    raise UserError(f"{run.run_dir / 'config.yaml'}: unreadable ({e.__class__.__name__})"
                    ) from None

