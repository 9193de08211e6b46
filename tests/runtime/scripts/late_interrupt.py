"""A Ctrl-C that comes when `fedsim`'s work is done.

Usage: late_interrupt.py WHEN. Runs `fedsim.cli.program` with a main() that
installs the exit handlers, as `fedsim run` does, and returns 0; WHEN says
where SIGINT is raised: `return`, as main() returns (its handler runs before
the work is marked done), or `atexit`, in an atexit callback that then keeps
running Python for 0.2 s (its handler runs during the exit).
"""

from __future__ import annotations

import atexit
import signal
import sys
import time

from fedsim import cli
from fedsim.runtime import signals


def _ctrl_c() -> None:
  signal.raise_signal(signal.SIGINT)
  end = time.monotonic() + 0.2
  while time.monotonic() < end:  # bytecodes: a handler still pending runs here
    pass


def _main(argv=None) -> int:
  del argv
  signals.install_exit_handlers()
  if sys.argv[1] == "atexit":
    atexit.register(_ctrl_c)
  else:
    _ctrl_c()
  return 0


if __name__ == "__main__":
  cli.main = _main
  cli.program()
