"""A player of the `processes` executor: one long-lived process that plays the
runs a study sends it, one after another.

`python -m fedsim.cli --play-runs [--plugin=P ...]` (`PLAYER_ARGS`) reads a run
directory per line on stdin, plays it exactly as `fedsim run --resume RUN_DIR
--no-progress` does in a process of its own (the CLI hands `serve` its own
`main` for that: the same code path, the same exit codes, the same status on
Ctrl-C), its output appended to RUN_DIR/output.log, and answers the exit code
on a line of its stdout. It imports Python's and TensorFlow's modules once,
which a process per run pays every time. A run stopped by SIGINT or SIGTERM
ends the player with that run's exit code (130, 143); stdin's end ends it
with 0.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import traceback
from typing import Callable, Iterator

CHILD_LOG = "output.log"  # what a run played in another process printed
PLAYER_ARGS = ["-m", "fedsim.cli", "--play-runs"]  # after the interpreter


@contextlib.contextmanager
def _output_to(path: pathlib.Path) -> Iterator[None]:
  """fd 1 and 2 (Python's and TensorFlow's output) appended to `path` in the body."""
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  saved = [os.dup(1), os.dup(2)]
  log = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    os.dup2(log, 1)
    os.dup2(log, 2)
    yield
  finally:
    for stream in (sys.stdout, sys.stderr):
      stream.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    for fd in (log, *saved):
      os.close(fd)


def serve(play: Callable[[pathlib.Path], int]) -> None:
  """Plays each run directory read on stdin with `play` (its exit code), then
  ends the process."""
  answers = os.fdopen(os.dup(1), "w", buffering=1)  # the study reads exit codes here
  null = os.open(os.devnull, os.O_WRONLY)
  os.dup2(null, 1)  # a run's output goes to its log only
  os.close(null)
  for line in sys.stdin:
    run_dir = pathlib.Path(line.rstrip("\n"))
    with _output_to(run_dir / CHILD_LOG):
      try:
        code = play(run_dir)
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()  # a bug in fedsim: into the run's log, as a child's would be
        code = 1
    answers.write(f"{code}\n")
  answers.close()
  # Python's teardown would spend seconds in TensorFlow's destructors; every
  # run's own cleanup is done (fedsim.runtime.signals.exit_now_if_signalled).
  worker = sys.modules.get("fedsim.runtime.worker")
  if worker is not None:
    worker.shutdown()
  sys.stderr.flush()
  os._exit(0)  # pylint: disable=protected-access
