"""A Ctrl-C's copy that the main thread can only handle seconds after it arrived.

Usage: late_second_handler.py. Prints 'ready'; on the KeyboardInterrupt it
prints 'interrupt', then enters a C call (libc's sleep, 3 s, the GIL released,
SIGINT blocked in this thread) and prints 'in C' first, as a Ray study's main
thread waits in Ray's C++ for its cancelled tasks. A SIGINT sent then is
received at once (the watcher thread takes it) but its Python handler runs
only when the call returns. Prints 'done' and exits 0 if nothing forced an exit.
"""

from __future__ import annotations

import ctypes
import signal
import time

from fedsim.runtime import signals


def main() -> None:
  signals.install_exit_handlers()
  try:  # Entered before 'ready': a signal right after it is caught too.
    print("ready", flush=True)
    while True:
      time.sleep(0.001)  # Python between sleeps: the first handler runs at once
  except KeyboardInterrupt:
    print("interrupt", flush=True)
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  print("in C", flush=True)
  ctypes.CDLL(None).sleep(3)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
  time.sleep(0.1)  # bytecodes: the late handler runs here
  print("done", flush=True)


if __name__ == "__main__":
  main()
