"""fedsim's control over the TFF runtime process and TensorFlow's start-up.

* `worker`: the owned `worker_binary` child process (start, kill, reap).
* `session`: which worker runs TFF computations (a run's session, the guard).
* `signals`: how `fedsim run` exits on SIGINT / SIGTERM.
* `inprocess`: the compiled round run in this process's TensorFlow.

Kept free of TensorFlow imports, as is `signals`.
"""


def install_guard() -> None:
  """Opt-in: computations called outside a run use a fedsim-owned worker.

  See `fedsim.runtime.session.install_guard` (imports TFF). For tests and
  notebooks that call TFF computations themselves; `fedsim.run` needs no guard.
  """
  from fedsim.runtime import session  # pylint: disable=g-import-not-at-top
  session.install_guard()
