"""Runtimes by name: what runs a built algorithm's rounds (TF-free; entries import TF lazily).

An entry is a `Runtime`: the dataclass of its typed parameters (the keys of
the `runtime:` section besides `name`, deriving from `RuntimeParams`), what it
can run (`supports`, a one-line reason when it cannot) and how it compiles a
built algorithm into the round the run loop calls, a
`fedsim.runtime.contract.RoundProcess`. `choose_runtime` is the one place that
decides what runs a run's rounds: the named runtime, or `local` when it cannot
run them. `fedsim list runtime` shows the entries; a plugin registers its own
with `register_runtime`, exactly as the built-ins (fedsim/runtime/builtin.py) do.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from fedsim.config.typed import bounded
from fedsim.registry import Registry
from fedsim.runtime.contract import RoundProcess

RUNTIMES = Registry("runtime")


@dataclasses.dataclass(frozen=True)
class RuntimeParams:
  """Keys every runtime has."""

  # Clients that keep state (error feedback, SCAFFOLD, EASGD, kept optimizer
  # slots): MiB of their states held in memory; the least recently sampled
  # beyond it are spilled to <run_dir>/client_states (0: all on disk).
  client_state_memory_mb: int = bounded(1024, min=0)
  # The TFF worker's parallelism (-1 = unlimited): it runs what a runtime
  # leaves to TFF (every computation of `local`).
  max_concurrent_computation_calls: int = -1


@dataclasses.dataclass(frozen=True)
class RuntimeContext:
  """What the experiment layer hands a runtime besides the algorithm.

  `worker_builder(device, **rebuild)` is picklable and rebuilds, in another
  process, what one remote worker needs from the experiment config:
  `(compiled round, pack(round_num, ids) -> client data)` (see
  `fedsim.runtime.cluster`); `rebuild` names another round of the run (see
  `Runtime.build_variant`).
  """

  worker_builder: Callable[[str], Any] | None = None


class Unsupported(Exception):
  """A runtime cannot run an algorithm; the message is one line saying why."""


class Runtime:
  """A registered runtime (subclass it; register an instance with `register_runtime`).

  `params` is its parameters' dataclass (deriving from `RuntimeParams`).
  `quiet_fallback`: when it cannot run an algorithm, `local` runs it without
  a notice (`auto`, whose meaning includes the fallback).
  """

  params: type = RuntimeParams
  quiet_fallback: bool = False

  def supports(self, algorithm: Any, params: Any) -> str | None:
    """None when this runtime can run `algorithm` (a `FederatedAlgorithm`),
    else a one-line reason. May compile: `build` reuses what it compiled."""
    del algorithm, params
    return None

  def build(self, algorithm: Any, params: Any, context: RuntimeContext) -> RoundProcess:
    """The round the loop calls (see `fedsim.runtime.contract`).

    Raises:
      Unsupported: it cannot run `algorithm` after all (one line).
      UserError, RunFailed: it could not start (e.g. an unreachable cluster).
    """
    raise NotImplementedError

  def build_variant(self, first: RoundProcess, algorithm: Any, params: Any,
                    context: RuntimeContext, rebuild: Mapping[str, Any]) -> RoundProcess:
    """Another round of the same run, next to `first` (what `build` gave):
    `algorithm`'s round, which `context.worker_builder(device, **rebuild)`
    rebuilds from the config (`fixed=value`: a controlled encoder parameter's
    value; `dispatch=True`: a buffered algorithm's client dispatch). By
    default built anew as `build` would; a runtime with workers reuses them.

    Raises:
      as `build`.
    """
    del first, rebuild
    return self.build(algorithm, params, context)

  def function(self, computation: Any, params: Any) -> Callable[..., Any]:
    """A TFF TensorFlow computation (e.g. the evaluator) as a function run on
    this runtime; the computation itself (TFF's worker) by default."""
    del params
    return computation

  def configure(self, params: Any) -> bool:
    """Sets up this process before TensorFlow runs its first op (e.g. its
    thread pools); True when it changed anything."""
    del params
    return False

  def precision(self, params: Any) -> str:
    """The float type the model computes in ('float32' or 'bfloat16')."""
    del params
    return "float32"

  def device(self, params: Any) -> str:
    """The device requested ('auto', 'cpu' or 'gpu'), for the environment check."""
    del params
    return "cpu"


def register_runtime(name: str, runtime: Runtime, replace: bool = False) -> Runtime:
  """Registers `runtime` under `name` with its parameters; returns it.

  Raises:
    TypeError: its `params` is not a dataclass deriving from RuntimeParams.
    ValueError: `name` is taken (unless `replace`).
  """
  if not (isinstance(runtime.params, type) and issubclass(runtime.params, RuntimeParams)):
    raise TypeError(f"runtime '{name}': params must be a dataclass deriving from RuntimeParams")
  RUNTIMES.register(name, runtime.params, replace=replace)(runtime)
  return runtime


def runtime_of(name: str) -> Runtime:
  """The registered runtime `name` (UserError naming `runtime.name` if unknown)."""
  return RUNTIMES.get(name, "runtime.name").build


@dataclasses.dataclass(frozen=True)
class RuntimeChoice:
  """What runs a run's rounds: the runtime after any fallback, and its first round.

  `notice` is the one line saying why the named runtime fell back to `local`
  (None when it did not, or fell back quietly).
  """

  runtime: Runtime
  params: Any
  context: RuntimeContext
  process: RoundProcess
  notice: str | None
  named: Runtime     # the configured runtime, and its parameters
  named_params: Any

  def variant(self, algorithm: Any, **rebuild: Any) -> RoundProcess:
    """Another round of the run on the same runtime (see `Runtime.build_variant`).

    Raises:
      as `Runtime.build`.
    """
    return _checked(self.runtime, self.runtime.build_variant(
        self.process, algorithm, self.params, self.context, rebuild))

  def function(self, computation: Any) -> Callable[..., Any]:
    """`computation` (e.g. the evaluator) as a function run where the named
    runtime runs it; on TFF's worker after a fallback with a notice."""
    if self.notice is not None:
      return self.runtime.function(computation, self.params)
    return self.named.function(computation, self.named_params)


def choose_runtime(name: str, params: Any, rounds: Sequence[Any],
                   context: RuntimeContext) -> RuntimeChoice:
  """The runtime `name` with `params` building the first of `rounds` (the built
  algorithms whose rounds the run plays: its round, and a buffered algorithm's
  dispatch), or `local` when it cannot run one of them.

  The fallback says why in `notice` (one line naming the runtime), unless the
  runtime's `quiet_fallback`.

  Raises:
    UserError, RunFailed: the runtime could not start (e.g. `ray` could not
      reach its cluster or start its workers).
    TypeError: a runtime's `build` returned no `RoundProcess`.
  """
  runtime = runtime_of(name)
  reason = next(filter(None, (runtime.supports(r, params) for r in rounds)), None)
  if reason is None:
    try:
      process = _checked(runtime, runtime.build(rounds[0], params, context))
      return RuntimeChoice(runtime, params, context, process, None, runtime, params)
    except Unsupported as e:
      reason = str(e)
  local = runtime_of("local")
  local_params = local.params()
  notice = None if runtime.quiet_fallback else (
      f"runtime.name: {name} cannot run this algorithm ({reason}); using local")
  return RuntimeChoice(local, local_params, context,
                       _checked(local, local.build(rounds[0], local_params, context)),
                       notice, runtime, params)


def _checked(runtime: Runtime, process: Any) -> RoundProcess:
  if not isinstance(process, RoundProcess):
    raise TypeError(f"runtime {type(runtime).__name__}: build returned a"
                    f" {type(process).__name__}, not a fedsim.runtime.contract.RoundProcess")
  return process


from fedsim.runtime import builtin  # noqa: E402,F401  (registers local, inprocess, ray, auto)
