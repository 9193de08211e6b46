"""Where rounds run: the runtimes, and fedsim's control over TFF's runtime process.

* `contract`: `RoundProcess`, what every runtime's round does for the run loop.
* `runtime_registry`: runtimes by name, and `choose_runtime` (the named one, or `local`).
* `tff_process`: `local`'s round, TFF's own process behind the contract.
* `inprocess`: the compiled round run in this process's TensorFlow; `cluster`: on Ray.
* `mixed`: a round as groups of clients, each run by its own round.
* `worker_binary`: the owned TFF `worker_binary` child process (start, kill, reap).
* `session`: which worker runs TFF computations (a run's session, the guard).
* `signals`: how `fedsim run` exits on SIGINT / SIGTERM.

Kept free of TensorFlow imports, as are `contract`, `runtime_registry` and `signals`.
"""


def install_guard() -> None:
  """Opt-in: computations called outside a run use a fedsim-owned worker.

  See `fedsim.runtime.session.install_guard` (imports TFF). For tests and
  notebooks that call TFF computations themselves; `fedsim.run` needs no guard.
  """
  from fedsim.runtime import session  # pylint: disable=g-import-not-at-top
  session.install_guard()
