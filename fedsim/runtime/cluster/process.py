"""The driver's side of the `ray` runtime: connect, build the actors, run and merge rounds."""

from __future__ import annotations

import atexit
import copy
import os
import sys
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from fedsim.errors import RunFailed, UserError
from fedsim.runtime.contract import RoundPhases, RoundProcess
from fedsim.runtime.cluster.address import auto_address, answers, check_reachable
from fedsim.runtime.cluster.failures import actor_cause, failed_worker, first_line
from fedsim.runtime.cluster.lifetime import (Reaper, process_handlers_kept,
                                             ray_log_off_the_terminal)
from fedsim.runtime.cluster.worker import ClientWorker, ClusterSpec, chunk_bounds

# Ray restarts a dead actor (which rebuilds itself from the config) and re-runs
# its chunk this many times before the round fails.
RESTARTS = 2
# A private instance (`address: local`) needs little shared memory: actors are
# sent client ids and the server's round input, and return accumulators.
_LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
_PROBE_S = 5.0  # how often a wait checks that the cluster still answers
# A run's output stays fedsim's: no usage reporting, no metrics agent (whose
# absence Ray logs as an error), no warning about a future GPU default. And
# Ray's workers run each node's own Python, where fedsim is installed: with
# `uv run` among this process's ancestors Ray would instead start them as
# `uv run` (at this machine's path of uv) in a copy of the current directory,
# uploaded to the cluster, whose fedsim would then shadow the installed one.
_RAY_ENVIRONMENT = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_enable_metrics_collection": "0",
                    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}

class ClusterProcess(RoundProcess, RoundPhases):
  """An `InProcessProcess` whose clients run on Ray actors: a `RoundProcess`, its own phases.

  `initialize`, `start`, `merge` and `finish` run in this (the driver's)
  process; each round's clients are split into `spec.workers` contiguous
  chunks. Call `close()` (or leave it to `atexit`) to kill the actors and
  disconnect; a private instance (`address: local`) is stopped then.
  """

  def __init__(self, local, build_worker: Callable[[], Any], spec: ClusterSpec,
               worker_class: type = ClientWorker):
    """Connects (or starts a private Ray instance) and builds the actors.

    Args:
      local: the driver's `InProcessProcess` of the same process.
      build_worker: picklable; called once in each actor (and again after a
        restart) to build `(InProcessProcess, pack(round_num, ids) -> client data)`.
      spec: where and how wide.
      worker_class: the actor's class (tests put a failing one in).

    Raises:
      UserError: a malformed or unreachable `runtime.address`, or workers
        that do not fit the cluster's CPUs or GPUs.
      RunFailed: an actor could not be built (one line: its error), or the
        actors were not ready within `runtime.timeout_s`.
    """
    for name, value in _RAY_ENVIRONMENT.items():
      os.environ.setdefault(name, value)  # read at import and by the nodes ray.init starts
    import ray  # pylint: disable=g-import-not-at-top
    self._ray = ray
    self._local = local
    self._variant: tuple = ()  # the actors' first round (see `with_variant`)
    self._spec = spec
    self._actors: list = []
    self._owned = False   # fedsim started the Ray instance (and stops it)
    self._connected = False
    self._lost = False    # the GCS stopped answering
    self._gcs = ""        # HOST:PORT of the cluster's GCS, probed while waiting
    self._reaper: Reaper | None = None  # of a private instance
    self._lock = threading.Lock()
    atexit.register(self.close)
    try:
      self._connect()
      self._check_fits()
      actor_class = ray.remote(worker_class).options(
          num_cpus=spec.cpus_per_worker, num_gpus=spec.gpus_per_worker,
          max_restarts=RESTARTS, max_task_retries=RESTARTS, scheduling_strategy="SPREAD")
      threads = max(1, int(spec.cpus_per_worker))
      self._actors = [actor_class.remote(build_worker, threads, os.getcwd(),
                                         spec.threads == "clients")
                      for _ in range(spec.workers)]
      self._get([a.pid.remote() for a in self._actors], "start-up")  # built, or why not
    except BaseException:
      self.close()
      raise

  # The runtime contract (fedsim.runtime.contract).

  @property
  def stateful_clients(self) -> bool:
    return self._local.stateful_clients

  @property
  def client_outputs(self) -> bool:
    return self._local.client_outputs

  @property
  def phases(self) -> RoundPhases:
    return self

  def initialize(self) -> Any:
    """The initial server state (computed on the driver)."""
    return self._local.initialize()

  def next(self, state: Any, client_data: Sequence[Any],
           client_states: Sequence[Any] | None = None) -> tuple[Any, ...]:
    """One round, as `InProcessProcess.next` (client states, when the clients
    keep state, travel with their clients' chunk and come back updated, as
    other per-client outputs come back).

    `client_data` with `ids` and `round_num` (the loop's lazy round clients)
    sends the actors ids; any other sequence of packed clients is shipped.

    Raises:
      ValueError: client states given for stateless clients, or missing (or
        not one per client) for stateful ones.
      RunFailed: a worker died more than `RESTARTS` times, raised, or gave
        no result within `runtime.timeout_s`; the cluster connection was lost.
    """
    from fedsim.runtime.carried_states import check_states  # TFF: loaded by the driver's round
    check_states(client_states, len(client_data), self.stateful_clients)
    client_input, zero = self.start(state)
    out = self.run_clients(client_input, zero, client_data, client_states)
    acc, outputs = out if self.client_outputs else (out, None)
    return self.finish(state, acc, outputs)

  # The round's phases, as `InProcessProcess` has them (a round whose clients
  # run different variants merges their groups: `fedsim.runtime.mixed`).

  def start(self, state: Any):
    """`(client_input, zero accumulator)` of the round, on the driver."""
    return self._local.start(state)

  def merge(self, first, second):
    return self._local.merge(first, second)

  def finish(self, state: Any, acc, outputs: Sequence[Any] | None = None):
    return self._local.finish(state, acc, outputs)

  def run_clients(self, client_input, zero, client_data: Sequence[Any],
                  client_states: Sequence[Any] | None = None) -> Any:
    """The accumulator of `client_data` from `zero` (the round's zero: each
    chunk starts from it), its chunks on the actors; with per-client outputs
    (new client states), `(accumulator, outputs)`.

    Raises:
      RunFailed: as `next`.
    """
    ray = self._ray
    # Put once, read by every actor (Ray resolves object refs passed as arguments).
    shared = (ray.put([np.asarray(v) for v in client_input]),
              ray.put([np.asarray(v) for v in zero]))
    states = (lambda s, e: ()) if client_states is None else (
        lambda s, e: (list(client_states[s:e]),))
    variant = {"variant": self._variant} if self._variant else {}
    ids = getattr(client_data, "ids", None)
    round_num = getattr(client_data, "round_num", None)
    if ids is not None and round_num is not None:
      ids = list(ids)
      count = len(ids)
      call = lambda actor, s, e: actor.run_ids.remote(round_num, ids[s:e], *shared,
                                                      *states(s, e), **variant)
      during = f"round {round_num}"
    else:
      data = list(client_data)
      count = len(data)
      call = lambda actor, s, e: actor.run_data.remote(*shared, data[s:e], *states(s, e),
                                                       **variant)
      during = "a round"
    bounds = chunk_bounds(count, self._spec.workers)
    calls = [(w, s, e) for w, (s, e) in enumerate(bounds) if e > s]
    outputs = self.client_outputs
    if not calls:
      return (zero, []) if outputs else zero
    parts = self._get([call(self._actors[w], s, e) for w, s, e in calls], during,
                      [w for w, _, _ in calls])
    per_client = None
    if outputs:
      per_client = [s for _, chunk_outputs in parts for s in chunk_outputs]
      parts = [acc for acc, _ in parts]
    acc = parts[0]
    for part in parts[1:]:  # fixed (chunk) order: the same sum every time
      acc = self._local.merge(acc, part)
    return (acc, per_client) if outputs else acc

  def with_variant(self, local, rebuild: Mapping[str, Any]) -> "ClusterProcess":
    """This cluster running another round of the run (`Runtime.build_variant`:
    a controlled encoder parameter's value, a buffered algorithm's dispatch):
    `local` is that round's driver-side `InProcessProcess`; each actor builds
    its own on first use, with the worker builder's keyword arguments `rebuild`."""
    view = copy.copy(self)
    view._local, view._variant = local, tuple(sorted(rebuild.items()))
    return view

  @property
  def actors(self) -> list:
    """The Ray actor handles, in chunk order (for diagnostics and tests)."""
    return list(self._actors)

  def worker_pids(self) -> list[int]:
    """Each actor's current process id, in chunk order (a restart changes it).

    Raises:
      RunFailed: as `next`.
    """
    return self._get([a.pid.remote() for a in self._actors], "asking the workers")

  def close(self) -> None:
    """Kills the actors and disconnects; stops a private instance. Idempotent."""
    with self._lock:
      ray = self._ray
      if self._lost:
        # Ray's own shutdown would wait for the lost GCS and its teardown then
        # crashes the process (exit 137/139): leave before it, as a failed run.
        atexit.unregister(ray.shutdown)
        atexit.register(_exit_failed)
      elif self._connected and ray.is_initialized():
        for actor in self._actors:
          try:
            ray.kill(actor, no_restart=True)
          except Exception:  # pylint: disable=broad-except
            pass  # already dead, or the cluster is gone
        ray.shutdown()  # a private instance's raylet and GCS stop with it
      if self._reaper is not None:
        self._reaper.sweep()  # its agents outlive ray.shutdown() by a minute
      self._actors, self._connected = [], False

  # Internals.

  def _connect(self) -> None:
    spec = self._spec
    self._reaper = connect(spec.address, "runtime.address",
                           num_cpus=spec.workers * spec.cpus_per_worker,
                           num_gpus=spec.workers * spec.gpus_per_worker)
    self._owned = self._reaper is not None
    self._connected = True
    self._gcs = self._ray.get_runtime_context().gcs_address

  def _check_fits(self) -> None:
    """UserError when the cluster cannot hold the workers (they would wait forever)."""
    if self._owned:
      return
    total = self._ray.cluster_resources()
    spec = self._spec
    for key, per, resource in (("cpus_per_worker", spec.cpus_per_worker, "CPU"),
                               ("gpus_per_worker", spec.gpus_per_worker, "GPU")):
      have = total.get(resource, 0.0)
      if per and spec.workers * per > have:
        raise UserError(f"runtime.workers: {spec.workers} workers x runtime.{key}={per:g}"
                        f" need {spec.workers * per:g} {resource}s; the cluster at"
                        f" {spec.address} has {have:g}")

  def _get(self, refs: list, during: str, workers: list[int] | None = None) -> list:
    """`ray.get(refs)` bounded by `timeout_s`; Ray's failures as one-line RunFailed.

    While waiting, the cluster's GCS is probed every `_PROBE_S`: Ray itself
    would wait out the timeout and then end this process (about 60 s after
    losing the GCS) without a word.
    """
    ray = self._ray
    deadline = time.monotonic() + self._spec.timeout_s
    try:
      while True:
        left = deadline - time.monotonic()
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, min(left, _PROBE_S)))
        if len(ready) == len(refs):
          return ray.get(refs, timeout=max(left, _PROBE_S))
        if left <= 0:
          for ref in refs:
            ray.cancel(ref, force=False)
          raise RunFailed(f"{during}: the ray workers gave no result within runtime.timeout_s"
                          f" = {self._spec.timeout_s:g} s")
        if not answers(self._gcs):
          self._lost = True
          raise RunFailed(f"{during}: lost the ray cluster (its head {self._gcs} stopped"
                          " answering); completed rounds and checkpoints are kept")
    except ray.exceptions.RayActorError as e:
      worker = failed_worker(refs, ray, workers or list(range(len(refs))))
      if during == "start-up":
        raise RunFailed(f"start-up: ray worker {worker} could not be built:"
                        f" {actor_cause(e)}") from None
      raise RunFailed(f"{during}: ray worker {worker} died and was not restarted (at most"
                      f" {RESTARTS} restarts): {actor_cause(e)}; the run can resume from its"
                      " last checkpoint") from None
    except ray.exceptions.RayTaskError as e:
      raise RunFailed(f"{during}: a ray worker failed: {first_line(e.cause or e)}") from None
    except ray.exceptions.RayError as e:
      raise RunFailed(f"{during}: lost the ray cluster ({type(e).__name__}:"
                      f" {first_line(e)})") from None


def connect(address: str, key: str, num_cpus: float, num_gpus: float = 0.0) -> Reaper | None:
  """Connects this process to Ray: `address` 'local' starts a private instance
  of `num_cpus` CPUs and `num_gpus` GPUs that ends with this process; 'auto'
  or HOST:PORT joins a running cluster.

  Returns:
    The private instance's Reaper (call `sweep()` after `ray.shutdown()`), or
    None for a cluster fedsim did not start.

  Raises:
    UserError: naming `key`: Ray already initialized in this process, a
      malformed address, or no cluster there.
  """
  for name, value in _RAY_ENVIRONMENT.items():
    os.environ.setdefault(name, value)  # read at import and by the nodes ray.init starts
  import ray  # pylint: disable=g-import-not-at-top
  if ray.is_initialized():  # e.g. a notebook's own ray.init: reuse, never stop it
    raise UserError(f"{key}: Ray is already initialized in this process;"
                    " call ray.shutdown() first (fedsim connects by itself)")
  options = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 configure_logging=True)
  if address == "local":
    reaper = Reaper()  # before ray.init: a driver killed during it is swept too
    try:
      with reaper.tagged(), process_handlers_kept(), ray_log_off_the_terminal():
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus or None,
                 object_store_memory=_LOCAL_OBJECT_STORE_BYTES, **options)
    except BaseException:
      reaper.sweep()
      raise
    return reaper
  target = auto_address(key) if address == "auto" else address
  check_reachable(target, address, key)
  try:
    with process_handlers_kept(), ray_log_off_the_terminal():
      ray.init(address=target, **options)
  except (ConnectionError, RuntimeError) as e:
    raise UserError(f"{key}: cannot connect to the Ray cluster at {target}:"
                    f" {first_line(e)}") from None
  return None


def _exit_failed() -> None:
  """Ends the process with RunFailed's exit code, skipping Ray's teardown."""
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(RunFailed.exit_code)
