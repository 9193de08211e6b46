"""A Ctrl-C that arrives while the interpreter runs a callback whose exceptions
it ignores: a garbage-collector callback (JAX's `_xla_gc_callback` in every
fedsim process that imported TFF), an object's `__del__` (asyncio's event
loops have one; a run drops TFF's loops while it trains) or a
`weakref.finalize` callback (TFF's remote values dispose of themselves so).

Usage: signal_in_callback.py gc|del|finalize. Under fedsim's exit handlers,
the callback raises SIGINT once, so Python runs fedsim's handler inside it;
Python reports an exception raised there as 'Exception ignored in ...' and
goes on. Prints what reached the script: "KeyboardInterrupt" when the
interrupt is raised in the frame that triggered the callback, "nothing
raised" when it was lost. Leaves with os._exit, before the shutdown deadline.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import weakref

from fedsim.runtime import signals


class Finalized:

  def __del__(self):
    signal.raise_signal(signal.SIGINT)  # Python runs the handler in this frame.


class Plain:
  pass


def _trigger(kind: str) -> None:
  """Makes the interpreter run a `kind` callback that raises SIGINT."""
  if kind == "gc":
    pending = [signal.SIGINT]

    def callback(phase, info):
      del info
      if phase == "start" and pending:
        signal.raise_signal(pending.pop())

    gc.callbacks.append(callback)
    gc.collect()
    return
  if kind == "del":
    dropped = Finalized()
  else:
    dropped = Plain()
    weakref.finalize(dropped, signal.raise_signal, signal.SIGINT)
  del dropped  # the finalizer runs here, called by the interpreter


def main(kind: str) -> None:
  signals.install_exit_handlers()
  try:
    _trigger(kind)
    for _ in range(1000):  # the triggering frame's next events
      pass
    print("nothing raised", flush=True)
  except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main(sys.argv[1])
