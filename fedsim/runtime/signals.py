"""How `fedsim run` turns signals into ordinary exits.

Imports no TensorFlow, so the CLI installs this before anything slow.
"""

from __future__ import annotations

import signal
import threading


def install_exit_handlers() -> None:
  """Turns SIGTERM into SystemExit(143), so `finally` blocks and atexit run.

  Does nothing outside the main thread, where Python cannot set handlers.
  """
  if threading.current_thread() is not threading.main_thread():
    return

  def on_sigterm(signum, frame):
    del frame
    raise SystemExit(128 + signum)

  signal.signal(signal.SIGTERM, on_sigterm)
