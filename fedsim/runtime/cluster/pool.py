"""Ray actors that outlive a run: this process's one connection to Ray and its idle actors.

Starting a run's actors costs seconds (each imports TensorFlow), so a run
that ends cleanly gives them back, and the next run in the same process with
actors of the same `Shape` leases them instead of starting new ones (each
task names its run and carries its build: `ClientWorker`). An actor in the
pool has no run: whatever it built is dropped when it builds the next one.

One connection per process (Ray allows one): a private instance (`local`)
stays up, with its idle actors, until `release()`, process exit, or a run
that needs another instance (more CPUs or GPUs than it has, or a cluster);
a cluster's connection likewise. Idle actors hold their CPUs and GPUs, so a
run that starts new actors kills the idle ones it does not take first.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
from typing import Any

from fedsim.errors import RunFailed, UserError
from fedsim.runtime.cluster.address import auto_address, check_reachable
from fedsim.runtime.cluster.failures import first_line
from fedsim.runtime.cluster.lifetime import (Reaper, process_handlers_kept,
                                             ray_log_off_the_terminal)

# Ray restarts a dead actor (which then rebuilds its run from the next task)
# and re-runs its chunk this many times before the round fails.
RESTARTS = 2
# A private instance (`address: local`) needs little shared memory: actors are
# sent client ids and the server's round input, and return accumulators.
_LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
# An idle actor answers a ping in milliseconds, and a dead one's fails at once;
# but Ray runs actors at niceness 15, and on two cores under a load of 14 a
# kept actor missed a 5 s ping (and was replaced, at the cost of a start-up).
# One that does not answer within this is restarting elsewhere, or hangs.
_PING_S = 60.0
# A run's output stays fedsim's: no usage reporting, no metrics agent (whose
# absence Ray logs as an error), no warning about a future GPU default. And
# Ray's workers run each node's own Python, where fedsim is installed: with
# `uv run` among this process's ancestors Ray would instead start them as
# `uv run` (at this machine's path of uv) in a copy of the current directory,
# uploaded to the cluster, whose fedsim would then shadow the installed one.
_RAY_ENVIRONMENT = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_enable_metrics_collection": "0",
                    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}


def import_ray():
  """Ray, imported with fedsim's environment for it (read at import and by the
  nodes `ray.init` starts)."""
  for name, value in _RAY_ENVIRONMENT.items():
    os.environ.setdefault(name, value)
  import ray  # pylint: disable=g-import-not-at-top
  return ray


@dataclasses.dataclass(frozen=True)
class Shape:
  """What makes two actors interchangeable: their class, what Ray reserves for
  each, and how their TensorFlow was set up (fixed once it runs)."""

  worker_class: type
  cpus: float
  gpus: float
  one_thread_ops: bool
  workdir: str


@dataclasses.dataclass
class Actor:
  """A pooled actor: its handle, and its process id when it was first built
  (another id means Ray restarted it, which spends one of its RESTARTS)."""

  handle: Any
  pid: int


@dataclasses.dataclass
class _Connection:
  address: str            # 'local', or the HOST:PORT connected to (`auto` resolved)
  gcs: str                # HOST:PORT of the cluster's GCS
  job: str                # Ray's job id of the connection (each ray.init has its own)
  reaper: Reaper | None   # of a private instance
  cpus: float = 0.0       # a private instance's size
  gpus: float = 0.0
  lost: bool = False


_lock = threading.RLock()
_connection: _Connection | None = None
_idle: dict[Shape, list[Actor]] = {}
_leased: dict[int, Any] = {}  # id(handle) -> handle, of actors runs hold
_atexit_registered = False


def connect(address: str, key: str, num_cpus: float, num_gpus: float = 0.0) -> Reaper | None:
  """Connects this process to Ray for a caller that disconnects itself: ends
  fedsim's own connection first (`release`); `address` 'local' starts a private
  instance of `num_cpus` CPUs and `num_gpus` GPUs that ends with this process;
  'auto' or HOST:PORT joins a running cluster.

  Returns:
    The private instance's Reaper (call `sweep()` after `ray.shutdown()`), or
    None for a cluster fedsim did not start.

  Raises:
    UserError: naming `key`: Ray initialized in this process by someone else
      (e.g. a notebook's own `ray.init`), a malformed address, or no cluster there.
  """
  release()
  return _init(address, key, num_cpus, num_gpus)[0]


def connection(address: str, key: str, num_cpus: float, num_gpus: float) -> str:
  """Connects (or stays connected) for a run's actors: the pool's connection
  when it serves `address` with room for `num_cpus` and `num_gpus` (a private
  instance's size), else a new one, the old one released.

  Returns:
    The cluster's GCS address (HOST:PORT).

  Raises:
    UserError: as `connect`.
    RunFailed: this process lost its cluster earlier (Ray cannot reconnect it).
  """
  global _connection, _atexit_registered
  ray = import_ray()
  with _lock:
    if _connection is not None and _connection.lost:
      raise RunFailed(f"start-up: this process lost its ray cluster (head {_connection.gcs})"
                      " in an earlier run; start a new process")
    if _connection is not None and not _ours(ray):
      _forget()  # someone called ray.shutdown(): its actors ended with the connection
    if _connection is not None:
      if _serves(_connection, address, num_cpus, num_gpus):
        return _connection.gcs
      release()
    reaper, target = _init(address, key, num_cpus, num_gpus)
    context = ray.get_runtime_context()
    _connection = _Connection(target, context.gcs_address, context.get_job_id(), reaper,
                              num_cpus, num_gpus)
    if not _atexit_registered:
      atexit.register(release)  # after Ray's own shutdown handler: runs before it
      _atexit_registered = True
    return _connection.gcs


def lease(shape: Shape, count: int, *, reuse: bool) -> list[Actor]:
  """`count` actors of `shape` for one run, idle ones first (with `reuse`);
  those that died or were restarted while idle are replaced. Call after
  `connection`.

  Returns:
    The actors; one started now has pid 0 until its first task tells it
    (`Actor.pid`).
  """
  ray = import_ray()
  with _lock:
    taken: list[Actor] = []
    if reuse:
      candidates = _idle.pop(shape, [])[:]
      taken, dead = _alive(ray, candidates[:count])
      _kill(ray, [a.handle for a in dead])
      if candidates[count:]:
        _idle[shape] = candidates[count:]
    started = count - len(taken)
    if started:
      for other in list(_idle):  # idle actors hold the CPUs and GPUs the new ones need
        _kill(ray, [a.handle for a in _idle.pop(other)])
      actor_class = ray.remote(shape.worker_class).options(
          num_cpus=shape.cpus, num_gpus=shape.gpus, max_restarts=RESTARTS,
          max_task_retries=RESTARTS, scheduling_strategy="SPREAD")
      threads = max(1, int(shape.cpus))
      taken += [Actor(actor_class.remote(threads, shape.workdir, shape.one_thread_ops), 0)
                for _ in range(started)]
    for actor in taken:
      _leased[id(actor.handle)] = actor.handle
    return taken


def give_back(shape: Shape, actors: list[Actor]) -> None:
  """Returns a run's actors to the pool (the run ended cleanly: no task in flight)."""
  with _lock:
    for actor in actors:
      _leased.pop(id(actor.handle), None)
    if _connection is not None and not _connection.lost and _ours(import_ray()):
      _idle.setdefault(shape, []).extend(actors)


def discard(actors: list[Actor], *, disconnect: bool = False) -> None:
  """Kills a run's actors (Ray restarts none of them); with `disconnect`, also
  ends the connection when no actor is left in the pool or held by a run
  (`release`)."""
  ray = import_ray()
  with _lock:
    for actor in actors:
      _leased.pop(id(actor.handle), None)
    if _connection is None or _connection.lost:
      return
    if _ours(ray):
      _kill(ray, [a.handle for a in actors])
    if disconnect and not _leased and not _idle:
      release()


def lose() -> None:
  """Marks the connection lost (its head stopped answering): nothing of it is
  touched again, and Ray's own teardown at exit, which would crash without its
  head, is skipped by the caller."""
  with _lock:
    if _connection is not None:
      _connection.lost = True
    _idle.clear()
    _leased.clear()


def idle_actors() -> list:
  """The handles of the actors waiting in the pool (for diagnostics and tests)."""
  with _lock:
    return [a.handle for actors in _idle.values() for a in actors]


def release() -> None:
  """Kills every actor fedsim started in this process (idle or held by a run),
  disconnects, and stops a private instance. Idempotent; also run at exit."""
  with _lock:
    if _connection is None or _connection.lost:
      return
    ray = import_ray()
    if _ours(ray):
      _kill(ray, [a.handle for actors in _idle.values() for a in actors] + list(_leased.values()))
      ray.shutdown()  # a private instance's raylet and GCS stop with it
    _forget()


def _forget() -> None:
  """Drops the pool's state (after the connection ended), sweeping a private instance."""
  global _connection
  reaper = _connection.reaper if _connection is not None else None
  _connection = None
  _idle.clear()
  _leased.clear()
  if reaper is not None:
    reaper.sweep()  # its agents outlive ray.shutdown() by a minute


def _ours(ray) -> bool:
  """Whether this process's Ray connection is still the pool's (not ended, nor
  replaced by someone's own `ray.shutdown()` and `ray.init()`)."""
  return (ray.is_initialized() and _connection is not None
          and ray.get_runtime_context().get_job_id() == _connection.job)


def _serves(conn: _Connection, address: str, num_cpus: float, num_gpus: float) -> bool:
  if address == "local":
    return conn.address == "local" and conn.cpus >= num_cpus and conn.gpus >= num_gpus
  if conn.address == "local":
    return False
  target = auto_address() if address == "auto" else address
  return target == conn.address


def _alive(ray, actors: list[Actor]) -> tuple[list[Actor], list[Actor]]:
  """(actors that answer a ping within `_PING_S` from the process they were
  built in, the others)."""
  if not actors:
    return [], []
  refs = [a.handle.pid.remote() for a in actors]
  ray.wait(refs, num_returns=len(refs), timeout=_PING_S)
  alive, dead = [], []
  for actor, ref in zip(actors, refs):
    try:
      same = ray.get(ref, timeout=0) == actor.pid
    except Exception:  # pylint: disable=broad-except
      same = False  # dead, or not answering
    (alive if same else dead).append(actor)
  return alive, dead


def _kill(ray, handles: list) -> None:
  for handle in handles:
    try:
      ray.kill(handle, no_restart=True)
    except Exception:  # pylint: disable=broad-except
      pass  # already dead, or the cluster is gone


def _init(address: str, key: str, num_cpus: float,
          num_gpus: float) -> tuple[Reaper | None, str]:
  """`ray.init` for `address` (see `connect`), refusing a connection this
  process already has: (a private instance's Reaper, 'local' or the HOST:PORT
  connected to)."""
  ray = import_ray()
  if ray.is_initialized():  # e.g. a notebook's own ray.init: refused, never stopped
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
    return reaper, "local"
  target = auto_address(key) if address == "auto" else address
  check_reachable(target, address, key)
  try:
    with process_handlers_kept(), ray_log_off_the_terminal():
      ray.init(address=target, **options)
  except (ConnectionError, RuntimeError) as e:
    raise UserError(f"{key}: cannot connect to the Ray cluster at {target}:"
                    f" {first_line(e)}") from None
  return None, target
