"""Runtimes by name: what runs a built algorithm's rounds (TF-free; entries import TF lazily).

An entry is a `Runtime`: the dataclass of its typed parameters (the keys of
the `runtime:` section besides `name`, deriving from `RuntimeParams`), what it
can run (`supports`, a one-line reason when it cannot) and how it compiles a
built algorithm into the process the run loop calls: `initialize()` and
`next(state, clients)` (or `next(state, clients, client_states) -> (state,
measurements, new_client_states)` when the algorithm's clients keep state).
`fedsim list runtime` shows the entries; a plugin registers its own with
`register_runtime`, exactly as the built-ins (fedsim/runtime/builtin.py) do.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from fedsim.config.typed import bounded
from fedsim.registry import Registry

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

  `worker_builder(device)` is picklable and rebuilds, in another process, what
  one remote worker needs from the experiment config: `(compiled round,
  pack(round_num, ids) -> client data)` (see `fedsim.runtime.cluster`).
  """

  worker_builder: Callable[[str], Any] | None = None


class Unsupported(Exception):
  """A runtime cannot run an algorithm; the message is one line saying why."""


class Runtime:
  """A registered runtime (subclass it; register an instance with `register_runtime`).

  `params` is its parameters' dataclass (deriving from `RuntimeParams`).
  """

  params: type = RuntimeParams

  def supports(self, algorithm: Any, params: Any) -> str | None:
    """None when this runtime can run `algorithm` (a `FederatedAlgorithm`),
    else a one-line reason. May compile: `build` reuses what it compiled."""
    del algorithm, params
    return None

  def build(self, algorithm: Any, params: Any, context: RuntimeContext) -> Any:
    """The process the loop calls (see the module docstring).

    Raises:
      Unsupported: it cannot run `algorithm` after all (one line).
      UserError, RunFailed: it could not start (e.g. an unreachable cluster).
    """
    raise NotImplementedError

  def build_variant(self, first: Any, algorithm: Any, params: Any, context: RuntimeContext,
                    value: Any) -> Any:
    """The process of another variant of the round (`algorithm`, built with a
    controlled encoder parameter at `value`), next to `first`, what `build`
    gave for the first one; by default built anew as `build` would.

    Raises:
      as `build`.
    """
    del first, value
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


from fedsim.runtime import builtin  # noqa: E402,F401  (registers local, inprocess, ray, auto)
