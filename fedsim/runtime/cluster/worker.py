"""A `ray` runtime's worker: the actor class, its chunk of a round, and the runtime's keys."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
  """Where and how wide: the `runtime` keys of `name: ray`."""

  address: str = "local"      # local | auto | HOST:PORT
  workers: int = 2            # actors, one chunk of each round's clients each
  cpus_per_worker: float = 1.0
  gpus_per_worker: float = 0.0
  device: str = "auto"        # TensorFlow device inside each actor
  timeout_s: float = 1800.0   # bound on start-up and on each round's results
  threads: str = "clients"    # runtime.threads: clients (one thread per op) | tensorflow
  keep_workers: bool = True   # actors outlive the run for the next one (`pool`)

  @classmethod
  def of(cls, runtime) -> "ClusterSpec":
    """The spec of validated `ray` runtime parameters (fedsim.runtime.builtin.RayParams)."""
    return cls(address=runtime.address, workers=runtime.workers,
               cpus_per_worker=runtime.cpus_per_worker,
               gpus_per_worker=runtime.gpus_per_worker, device=runtime.device,
               timeout_s=runtime.timeout_s, threads=runtime.threads,
               keep_workers=runtime.keep_workers)


def chunk_bounds(count: int, workers: int) -> list[tuple[int, int]]:
  """`[start, end)` of each worker's contiguous chunk of `count` clients.

  Sizes differ by at most one; with fewer clients than workers some chunks
  are empty (their workers are not called that round).
  """
  return [(w * count // workers, (w + 1) * count // workers) for w in range(workers)]


class ClientWorker:
  """One Ray actor's work: its chunk of a round's clients, from a zero accumulator.

  Plain Python here; `ClusterProcess` makes it a Ray actor class. An actor
  serves one run at a time and may serve several in turn (`fedsim.runtime.
  cluster.pool`): every task names its run, `(run key, [build])`, and the
  actor builds the run on the first task of a new key (also after Ray
  restarted it), dropping what it built for the run before.
  """

  def __init__(self, threads: int, workdir: str | None = None, one_thread_ops: bool = True):
    """Sets TensorFlow up once per actor life: `threads` (the actor's CPUs) ops
    run at once, each on one thread with `one_thread_ops` (`runtime.threads:
    clients`) or on `threads` too (`tensorflow`)."""
    if workdir and os.path.isdir(workdir):
      os.chdir(workdir)  # relative data and plugin paths mean what they meant to the driver
    from fedsim.backend import quiet  # pylint: disable=g-import-not-at-top
    quiet.import_tff()  # as a run's driver does (the packages it defers, too)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.threading.set_intra_op_parallelism_threads(1 if one_thread_ops else threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    self._run = None  # key of the run built here
    self._build: Callable[..., tuple[Any, Callable[[int, Sequence[str]], list]]] | None = None
    self._process = self._pack = None
    self._variants: dict[Any, Any] = {}

  def pid(self) -> int:
    """This actor's process id (it changes when Ray restarts the actor)."""
    return os.getpid()

  def prepare(self, run: tuple[str, list]) -> int:
    """Builds `run` (see the class docstring) unless built already: this
    actor's process id."""
    self._built(run)
    return os.getpid()

  def run_ids(self, run: tuple[str, list], round_num: int, ids: Sequence[str], client_input,
              zero, client_states: Sequence[Any] | None = None, variant: tuple = ()):
    """The accumulator of clients `ids` of round `round_num`, packed here (see `run_data`)."""
    self._built(run)
    return self.run_data(run, client_input, zero, self._pack(round_num, ids), client_states,
                         variant)

  def run_data(self, run: tuple[str, list], client_input, zero, client_data: Sequence[Any],
               client_states: Sequence[Any] | None = None, variant: tuple = ()):
    """The accumulator of `client_data` (packed clients, in order) from `zero`;
    with per-client outputs (e.g. new client states, given `client_states`,
    one per client), `(accumulator, outputs)`. `variant`: the `(key, value)`
    pairs that rebuild another round of the run (built here on first use,
    `build(**dict(variant))`, e.g. `fixed=` a controlled parameter's value);
    (): the first round."""
    self._built(run)
    process = self._process
    if variant:
      if variant not in self._variants:
        self._variants[variant] = self._build(**dict(variant))[0]
      process = self._variants[variant]
    out = process.run_clients(client_input, zero, client_data, client_states)
    if not process.client_outputs:
      return [np.asarray(a) for a in out]
    acc, outputs = out
    return [np.asarray(a) for a in acc], outputs

  def _built(self, run: tuple[str, list]) -> None:
    """Builds `run = (key, [build])` if another run (or none) was built here;
    `build`: the Ray object ref of the driver's builder (in a list, so that Ray
    passes the ref: it is fetched only when built)."""
    key, (build,) = run
    if key == self._run:
      return
    self._run, self._process, self._pack, self._variants = None, None, None, {}
    import ray  # pylint: disable=g-import-not-at-top
    self._build = build = ray.get(build)
    self._process, self._pack = build()
    self._run = key
