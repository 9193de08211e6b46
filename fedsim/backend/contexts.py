"""TFF execution contexts that run computations on a remote `worker_binary`.

Everything fedsim needs from TFF's context stack and executor framework is
here: the synchronous context over a gRPC stub, installing it for a block of
code (and restoring what was there), making it the default, and stopping the
event-loop thread TFF starts for it. TFF's context stack is per thread: a
context installed here applies to the calling thread only.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

from fedsim.backend import quiet

tff = quiet.import_tff()


def worker_binary() -> str:
  """The path of the `worker_binary` executable bundled with TFF."""
  return os.path.join(os.path.dirname(tff.__file__), "data", "worker_binary")


def grpc_stub(channel) -> Any:
  """A TFF executor stub over a `grpc.Channel`; its `is_ready` says if it answers."""
  return tff.framework.RemoteExecutorGrpcStub(channel)


def _compile(computation):
  """TFF's native compilation, after replacing secure sums with their plain
  equivalents (modular and bounded as the secure protocol computes them): the
  C++ worker cannot run TFF's secure intrinsics, which is how TFF's own test
  contexts simulate secure aggregation."""
  computation = tff.backends.test.replace_secure_intrinsics_with_bodies(computation)
  return tff.backends.native.desugar_and_transform_to_native(computation)


def remote_context(stub_for_call: Callable[[], Any]) -> Any:
  """A synchronous TFF context whose executors talk to `stub_for_call()`.

  `stub_for_call` is called each time TFF builds an executor (at the first
  call, when the number of clients changes, and on each retry after an
  unavailable worker), so it may raise to end a call instead of retrying.
  """

  def executor_stack(cardinalities):
    if cardinalities.get(tff.CLIENTS) is None:  # As TFF's own stack does.
      cardinalities[tff.CLIENTS] = 0
    executor = tff.framework.RemoteExecutor(stub_for_call())
    executor.set_cardinalities(cardinalities)
    return executor

  return tff.framework.SyncExecutionContext(
      tff.framework.ResourceManagingExecutorFactory(executor_stack),
      compiler_fn=_compile,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result)


@contextlib.contextmanager
def installed(context) -> Iterator[None]:
  """Runs the `with` body's computations (in this thread) on `context`.

  The context is pushed on TFF's context stack and popped on any exit, so
  whatever ran computations before (TFF's own default, a guard, an enclosing
  block) does again afterwards; nothing is replaced.
  """
  with tff.framework.get_context_stack().install(context):
    yield


def set_default(context) -> None:
  """Makes `context` this thread's default: what runs computations outside `installed`."""
  tff.framework.set_default_context(context)


def drop_default() -> None:
  """Makes this thread's default context one that refuses to run computations.

  For a process that is about to exit: TFF's own default context owns a
  manager of TFF's worker whose finalizer, when it runs during interpreter
  teardown, prints a traceback ("'NoneType' object has no attribute 'Popen'");
  dropped while modules are intact, it goes quietly.
  """
  from tensorflow_federated.python.core.impl.context_stack import set_default_context  # pylint: disable=g-import-not-at-top
  set_default_context.set_no_default_context()


def retire(context, timeout_s: float) -> bool:
  """Ends the event-loop thread of a context that no call can reach any more.

  TFF's SyncExecutionContext starts a (daemon) thread that only its `__del__`
  stops, yet the thread keeps the context alive, so each context would leave
  one behind. Call it only when no call is in flight.

  Returns:
    True if the thread ended within `timeout_s` seconds (or there was none).
  """
  runner = getattr(context, "_async_runner", None)
  loop = getattr(runner, "_event_loop", None)
  thread = getattr(runner, "_thread", None)
  if loop is None or thread is None:  # A TFF with other internals.
    return True
  loop.call_soon_threadsafe(loop.stop)
  thread.join(timeout=timeout_s)
  return not thread.is_alive()
