"""fedsim's own runtimes, registered as a plugin's would be: `local`, `inprocess`, `ray`,
`lockstep`, `auto`.

`auto` (the default) runs the compiled round in this process (`inprocess`)
whenever that runtime supports the algorithm, else TFF's worker (`local`,
chosen by `registry.choose_runtime` without a notice).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Literal

from fedsim.config.typed import bounded
from fedsim.runtime.runtime_registry import (Runtime, RuntimeContext, RuntimeParams, Unsupported,
                                             register_runtime)


@dataclasses.dataclass(frozen=True)
class CompiledParams(RuntimeParams):
  """Keys of the runtimes that run the compiled round in TensorFlow."""

  device: Literal["auto", "cpu", "gpu"] = "auto"  # auto = a GPU if TensorFlow sees one
  # clients: each op on one thread, as many ops at once as cores, so clients
  # train side by side (a batch's small ops do not scale across cores, clients
  # do); tensorflow: TF's default pools. Set when a run starts TensorFlow; a
  # process whose TF already runs keeps its pools. A ray actor sizes both to
  # its cpus_per_worker instead of the machine's cores.
  threads: Literal["clients", "tensorflow"] = "clients"
  # bfloat16: forward and backward passes in bfloat16 from float32 weights;
  # weights, updates, optimizers and sizing stay float32.
  precision: Literal["float32", "bfloat16"] = "float32"


@dataclasses.dataclass(frozen=True)
class RayParams(CompiledParams):
  # local (a private Ray instance fedsim starts and stops), auto (the cluster
  # `ray start` made on this machine) or HOST:PORT.
  address: str = "local"
  workers: int = bounded(2, min=1)  # actors; each runs one contiguous chunk of every round's clients
  cpus_per_worker: float = bounded(1.0, gt=0)   # Ray's num_cpus
  gpus_per_worker: float = bounded(0.0, min=0)  # Ray's num_gpus
  # Seconds a round (or start-up) may wait for the actors before the run fails.
  timeout_s: float = bounded(1800.0, gt=0)
  # A run that ends cleanly leaves its actors (and a private instance) up for
  # the next run of this process with the same actors, which then starts in
  # a second or two (bench/ray_reuse.py) instead of importing TensorFlow in
  # each; false: they end with the run.
  keep_workers: bool = True

  def check(self, key: str) -> None:
    from fedsim.runtime.cluster.address import check_address  # TF-free
    check_address(self.address)


@dataclasses.dataclass(frozen=True)
class LockstepParams(CompiledParams):
  # MiB one graph call may hold of its clients' stacked weights, optimizer
  # states and padded batches; a round's further clients run in further calls.
  memory_mb: int = bounded(512, min=1)
  # tensorflow by default: lockstep runs few, large ops (all clients at once),
  # which scale across cores; `clients` would run each on one thread.
  threads: Literal["clients", "tensorflow"] = "tensorflow"


class Local(Runtime):
  """TFF's own C++ runtime, in a worker process fedsim owns (runs any TFF process)."""

  params = RuntimeParams

  def build(self, algorithm, params, context):
    from fedsim.runtime.tff_process import TffProcess
    return TffProcess(algorithm.process)


# Compiled rounds by process: `supports` compiles, `build` reuses it.
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class InProcess(Runtime):
  """The round's MapReduceForm compiled into this process's TensorFlow (CPU or GPU)."""

  params = CompiledParams

  def supports(self, algorithm, params) -> str | None:
    try:
      self._compiled(algorithm, params)
    except Unsupported as e:
      return str(e)
    return None

  def build(self, algorithm, params, context):
    return self._compiled(algorithm, params)

  def _compiled(self, algorithm, params):
    from fedsim.runtime import devices, inprocess
    key = algorithm.process
    device = devices.select_device(params.device)  # UserError for a missing GPU
    found = _COMPILED.get(key)
    if found is None or found[0] != device:
      try:
        found = (device, inprocess.InProcessProcess(algorithm.process, params.device))
      except inprocess.NotCompilable as e:
        found = (device, Unsupported(str(e)))
      _COMPILED[key] = found
    if isinstance(found[1], Unsupported):
      raise found[1]
    return found[1]

  def function(self, computation, params):
    from fedsim.runtime import inprocess
    return inprocess.tensorflow_function(computation, params.device)

  def configure(self, params) -> bool:
    from fedsim.runtime.devices import configure_threads
    return configure_threads(params.threads)

  def precision(self, params) -> str:
    return params.precision

  def device(self, params) -> str:
    return params.device


class Ray(InProcess):
  """`inprocess`'s round with each round's clients split over Ray actors (a cluster or a private instance)."""

  params = RayParams

  def build(self, algorithm, params, context: RuntimeContext):
    import functools
    from fedsim.runtime import cluster
    compiled = self._compiled(algorithm, params)
    build = functools.partial(context.worker_builder, params.device)
    return cluster.ClusterProcess(compiled, build, cluster.ClusterSpec.of(params))

  def build_variant(self, first, algorithm, params, context, rebuild):
    # The same actors: each builds the variant's round itself on first use.
    return first.with_variant(self._compiled(algorithm, params), rebuild)


class Auto(InProcess):
  """The fastest runtime here that runs the algorithm: inprocess, else local."""

  quiet_fallback = True

  def function(self, computation, params) -> Any:
    from fedsim.runtime.inprocess import NotCompilable
    try:
      return super().function(computation, params)
    except NotCompilable:  # not plain TensorFlow: TFF's worker runs it
      return computation


class Lockstep(InProcess):
  """A round's clients trained as one computation over a client axis (GPU-first).

  Named only: `auto` never picks it, and a round it cannot run is a one-line
  error rather than a fallback (see fedsim/runtime/lockstep.py).
  """

  params = LockstepParams

  def supports(self, algorithm, params) -> str | None:
    return None  # `build` says why not, as an error: the user asked for lockstep

  def build(self, algorithm, params, context):
    from fedsim.errors import UserError
    from fedsim.runtime import lockstep
    try:
      return lockstep.LockstepRound(algorithm, params.device, params.memory_mb * 2**20)
    except lockstep.NotLockstep as e:
      raise UserError(f"runtime.name: lockstep cannot run this round: {e}") from None


register_runtime("local", Local())
register_runtime("inprocess", InProcess())
register_runtime("ray", Ray())
register_runtime("lockstep", Lockstep())
register_runtime("auto", Auto())
