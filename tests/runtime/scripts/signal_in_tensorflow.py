"""A signal that arrives while TensorFlow's C code has called back into Python.

Usage: signal_in_tensorflow.py LOG_DIR SIGNAL... (INT, TERM). Under fedsim's
exit handlers, runs eager TensorFlow ops (issue 27's were TensorBoard summary
ops); during each later op, the first read of the eager context's `_handle`
(which TF's C code makes for every op it executes) raises the next SIGNAL, so
Python runs fedsim's handler inside that callback, the moment a Ctrl-C under
load hit at random. Prints the type (and exit code) of what each op raised.
LOG_DIR is unused.
Leaves with os._exit, before the handlers' shutdown deadline.
"""

from __future__ import annotations

import os
import signal
import sys

from fedsim.runtime import signals


def main(log_dir: str, names: list[str]) -> None:
  signals.install_exit_handlers()
  del log_dir
  from fedsim.reporting.sinks import load_tensorflow  # pylint: disable=g-import-not-at-top
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  tf = load_tensorflow()
  tf.math.add(1.0, 1.0)
  handle = context.Context._handle  # pylint: disable=protected-access
  pending = []

  def handle_then_signal(ctx):
    if pending:
      signal.raise_signal(pending.pop())  # Python runs the handler in this frame.
    return handle.fget(ctx)

  context.Context._handle = property(handle_then_signal)  # pylint: disable=protected-access
  for step, name in enumerate(names, start=2):
    pending.append(getattr(signal, f"SIG{name}"))
    try:
      tf.math.add(1.0, float(step))  # through TFE_Py_FastPathExecute, in C
      print("nothing raised", flush=True)
    except BaseException as e:  # pylint: disable=broad-except
      code = f" {e.code}" if isinstance(e, SystemExit) else ""
      print(f"{type(e).__name__}{code}", flush=True)
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
