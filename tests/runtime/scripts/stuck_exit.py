"""A process whose way out never ends, under fedsim's exit handlers.

Usage: stuck_exit.py OUT_DIR [HINT [DEADLINE_S]]. Prints 'ready', then swallows
every KeyboardInterrupt (printing 'interrupt'), as a blocked shutdown would;
only the handlers' deadline or a second Ctrl-C can end it. The forced-exit hook
writes OUT_DIR/hook; HINT is what a forced exit says to resume; DEADLINE_S
replaces `signals.EXIT_DEADLINE_S` (tests that wait for it need not wait 8 s).
"""

from __future__ import annotations

import os
import sys
import time

from fedsim.runtime import signals


def main(out_dir: str, hint: str = "", deadline_s: str = "") -> None:
  if deadline_s:
    signals.EXIT_DEADLINE_S = float(deadline_s)
  signals.install_exit_handlers()
  if hint:
    signals.set_resume_hint(hint)
  with signals.forced_exit_hook(lambda: open(os.path.join(out_dir, "hook"), "w").close()):
    ready = False
    while True:
      try:  # Entered before 'ready': a signal right after it is swallowed too.
        if not ready:
          ready = True
          print("ready", flush=True)
        time.sleep(60)
      except KeyboardInterrupt:
        print("interrupt", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:4])
