"""The driver's side of the `ray` runtime: lease the actors, run and merge rounds."""

from __future__ import annotations

import atexit
import copy
import dataclasses
import os
import sys
import threading
import time
import uuid
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from fedsim.errors import RunFailed, UserError
from fedsim.runtime.contract import RoundPhases, RoundProcess
from fedsim.runtime.cluster import pool
from fedsim.runtime.cluster.address import answers
from fedsim.runtime.cluster.failures import actor_cause, failed_worker, first_line
from fedsim.runtime.cluster.pool import RESTARTS
from fedsim.runtime.cluster.worker import ClientWorker, ClusterSpec, chunk_bounds

_PROBE_S = 5.0  # how often a wait checks that the cluster still answers


@dataclasses.dataclass
class _Lease:
  """A run's actors, shared by its variants' views (`with_variant`)."""

  actors: list[pool.Actor]
  failed: bool = False  # a call failed or was interrupted: the actors are not given back
  closed: bool = False


class ClusterProcess(RoundProcess, RoundPhases):
  """An `InProcessProcess` whose clients run on Ray actors: a `RoundProcess`, its own phases.

  `initialize`, `start`, `merge` and `finish` run in this (the driver's)
  process; each round's clients are split into `spec.workers` contiguous
  chunks. The actors come from this process's pool (`fedsim.runtime.cluster.
  pool`): with `spec.keep_workers`, idle ones of the same shape are reused
  and a clean `close()` gives them back; else, and after any failure, they
  are killed.
  """

  def __init__(self, local, build_worker: Callable[[], Any], spec: ClusterSpec,
               worker_class: type = ClientWorker):
    """Connects (or starts a private Ray instance), leases the actors and has
    each build the run.

    Args:
      local: the driver's `InProcessProcess` of the same process.
      build_worker: picklable; called in each actor (on the run's first task,
        and again after a restart) to build `(InProcessProcess, pack(round_num,
        ids) -> client data)`.
      spec: where and how wide.
      worker_class: the actor's class (tests put a failing one in).

    Raises:
      UserError: a malformed or unreachable `runtime.address`, Ray already
        initialized by someone else, or workers that do not fit the cluster's
        CPUs or GPUs.
      RunFailed: an actor could not be built (one line: its error), or the
        actors were not ready within `runtime.timeout_s`.
    """
    ray = pool.import_ray()
    self._ray = ray
    self._local = local
    self._variant: tuple = ()  # the actors' first round (see `with_variant`)
    self._spec = spec
    self._gcs = ""        # HOST:PORT of the cluster's GCS, probed while waiting
    self._lock = threading.Lock()
    self._lease = _Lease([])
    self._shape = pool.Shape(worker_class, spec.cpus_per_worker, spec.gpus_per_worker,
                             spec.threads == "clients", os.getcwd())
    # Every task names the run and carries its build: an actor builds it on
    # the run's first task (or after a restart), whatever it ran before. The
    # build is nested in a list, so Ray hands the actor its ref, not its value.
    self._run = uuid.uuid4().hex
    self._build: list = []  # [its object ref]
    try:
      self._gcs = pool.connection(spec.address, "runtime.address",
                                  num_cpus=spec.workers * spec.cpus_per_worker,
                                  num_gpus=spec.workers * spec.gpus_per_worker)
      self._check_fits()
      self._build = [ray.put(build_worker)]
      self._lease.actors = pool.lease(self._shape, spec.workers, reuse=spec.keep_workers)
      pids = self._get([a.handle.prepare.remote((self._run, self._build))
                        for a in self._lease.actors], "start-up")  # built, or why not
      for actor, pid in zip(self._lease.actors, pids):
        actor.pid = actor.pid or pid
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
    run = (self._run, self._build)
    ids = getattr(client_data, "ids", None)
    round_num = getattr(client_data, "round_num", None)
    if ids is not None and round_num is not None:
      ids = list(ids)
      count = len(ids)
      call = lambda actor, s, e: actor.run_ids.remote(run, round_num, ids[s:e], *shared,
                                                      *states(s, e), **variant)
      during = f"round {round_num}"
    else:
      data = list(client_data)
      count = len(data)
      call = lambda actor, s, e: actor.run_data.remote(run, *shared, data[s:e],
                                                       *states(s, e), **variant)
      during = "a round"
    bounds = chunk_bounds(count, self._spec.workers)
    calls = [(w, s, e) for w, (s, e) in enumerate(bounds) if e > s]
    outputs = self.client_outputs
    if not calls:
      return (zero, []) if outputs else zero
    actors = self._lease.actors
    parts = self._get([call(actors[w].handle, s, e) for w, s, e in calls], during,
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
    return [a.handle for a in self._lease.actors]

  def worker_pids(self) -> list[int]:
    """Each actor's current process id, in chunk order (a restart changes it).

    Raises:
      RunFailed: as `next`.
    """
    return self._get([a.pid.remote() for a in self.actors], "asking the workers")

  def close(self) -> None:
    """Ends the run's hold on its actors. Idempotent (views of variants share it).

    With `keep_workers`, after a clean run (no call failed or was interrupted,
    and no exception is being handled: `close` as a `with` block's exit after
    an error) the actors go back to the pool, idle and connected; otherwise
    they are killed, and without `keep_workers` the connection ends too (a
    private instance stops) when no other run holds actors.
    """
    with self._lock:
      lease = self._lease
      if lease.closed:
        return
      lease.closed = True
      clean = not lease.failed and sys.exc_info()[0] is None
      if clean and self._spec.keep_workers:
        pool.give_back(self._shape, lease.actors)
      else:
        pool.discard(lease.actors, disconnect=not self._spec.keep_workers)

  # Internals.

  def _check_fits(self) -> None:
    """UserError when the cluster cannot hold the workers (they would wait forever)."""
    if self._spec.address == "local":  # sized for the run
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

  def _lose(self) -> None:
    """The cluster's head stopped answering: Ray's own shutdown would wait for
    it and its teardown then crashes the process (exit 137/139), so the
    process leaves before it, as a failed run, and the pool forgets the cluster."""
    pool.lose()
    atexit.unregister(self._ray.shutdown)
    atexit.register(_exit_failed)

  def _get(self, refs: list, during: str, workers: list[int] | None = None) -> list:
    """`ray.get(refs)` bounded by `timeout_s`; Ray's failures as one-line RunFailed.

    While waiting, the cluster's GCS is probed every `_PROBE_S`: Ray itself
    would wait out the timeout and then end this process (about 60 s after
    losing the GCS) without a word.
    """
    deadline = time.monotonic() + self._spec.timeout_s
    try:
      return self._wait(refs, during, deadline, workers or list(range(len(refs))))
    except BaseException:
      self._lease.failed = True  # tasks may still run: the actors are not given back
      raise

  def _wait(self, refs: list, during: str, deadline: float,
            workers: list[int]) -> list:
    ray = self._ray
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
          self._lose()
          raise RunFailed(f"{during}: lost the ray cluster (its head {self._gcs} stopped"
                          " answering); completed rounds and checkpoints are kept")
    except ray.exceptions.RayActorError as e:
      worker = failed_worker(refs, ray, workers, ray.exceptions.RayActorError)
      if during == "start-up":
        raise RunFailed(f"start-up: ray worker {worker} could not be built:"
                        f" {actor_cause(e)}") from None
      raise RunFailed(f"{during}: ray worker {worker} died and was not restarted (at most"
                      f" {RESTARTS} restarts): {actor_cause(e)}; the run can resume from its"
                      " last checkpoint") from None
    except ray.exceptions.RayTaskError as e:
      if during == "start-up":  # the run's build raised in the actor
        worker = failed_worker(refs, ray, workers, ray.exceptions.RayTaskError)
        cause = e.cause or e
        raise RunFailed(f"start-up: ray worker {worker} could not be built:"
                        f" {type(cause).__name__}: {first_line(cause)}") from None
      raise RunFailed(f"{during}: a ray worker failed: {first_line(e.cause or e)}") from None
    except ray.exceptions.RayError as e:
      raise RunFailed(f"{during}: lost the ray cluster ({type(e).__name__}:"
                      f" {first_line(e)})") from None


def _exit_failed() -> None:
  """Ends the process with RunFailed's exit code, skipping Ray's teardown."""
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(RunFailed.exit_code)
