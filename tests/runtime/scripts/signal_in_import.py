"""A Ctrl-C that arrives while a module is being imported, as a run imports
matplotlib lazily to draw its board: the interrupt is raised in the frame
that made the import, once the module is imported whole.

Usage: signal_in_import.py DIR. Writes two modules to DIR: `outer` imports
`inner`, whose body raises SIGINT and then finishes. Prints what reached the
script and whether both modules were imported whole ("KeyboardInterrupt
whole"), or "KeyboardInterrupt cut" when the interrupt cut the import short.
Leaves with os._exit, before the shutdown deadline.
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys

from fedsim.runtime import signals

INNER = """
import signal
signal.raise_signal(signal.SIGINT)  # Python runs fedsim's handler in this module's body.
for _ in range(1000):
  pass
whole = True
"""
OUTER = """
import inner
whole = inner.whole
"""


def main(directory: str) -> None:
  folder = pathlib.Path(directory)
  (folder / "inner.py").write_text(INNER)
  (folder / "outer.py").write_text(OUTER)
  sys.path.insert(0, str(folder))
  signals.install_exit_handlers()
  try:
    import outer  # pylint: disable=g-import-not-at-top,import-outside-toplevel,unused-import
    for _ in range(1000):  # the importing frame's next events
      pass
    print("nothing raised", flush=True)
  except KeyboardInterrupt:
    whole = getattr(sys.modules.get("outer"), "whole", False)
    print("KeyboardInterrupt", "whole" if whole else "cut", flush=True)
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main(sys.argv[1])
