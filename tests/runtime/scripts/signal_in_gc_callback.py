"""A Ctrl-C that arrives while a garbage-collector callback runs (as JAX's
`_xla_gc_callback` does in every fedsim process that imported TFF).

Under fedsim's exit handlers, a gc callback raises SIGINT once, so Python runs
fedsim's handler inside it; then `gc.collect()` returns and the script goes
on. Prints what reached the script: "KeyboardInterrupt" when the interrupt is
raised in the frame that triggered the collection, "nothing raised" when the
gc machinery swallowed it. Leaves with os._exit, before the shutdown deadline.
"""

from __future__ import annotations

import gc
import os
import signal

from fedsim.runtime import signals


def main() -> None:
  signals.install_exit_handlers()
  pending = [signal.SIGINT]

  def callback(phase, info):
    del info
    if phase == "start" and pending:
      signal.raise_signal(pending.pop())  # Python runs the handler in this frame.

  gc.callbacks.append(callback)
  try:
    gc.collect()
    for _ in range(1000):  # the raising frame's next events
      pass
    print("nothing raised", flush=True)
  except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main()
