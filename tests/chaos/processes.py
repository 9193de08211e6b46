"""The processes of one `fedsim run` started with a marker in its environment.

Every process the run starts (a TFF worker, Ray's GCS, raylet, agents and
actors) inherits the driver's environment, so the marker finds all of them,
whatever their command line became (Ray renames actors `ray::ClientWorker`).
"""

from __future__ import annotations

import os
import pathlib
import signal
import time

MARKER = "FEDSIM_TEST_MARKER"


def marked(marker: str) -> list[tuple[int, str]]:
  """(pid, command line) of the live processes (not zombies) whose environment holds `marker`."""
  found = []
  needle = f"{MARKER}={marker}".encode()
  for entry in pathlib.Path("/proc").iterdir():
    if not entry.name.isdigit():
      continue
    try:
      stat = (entry / "stat").read_text()
      if stat[stat.rindex(")") + 2] == "Z" or needle not in (entry / "environ").read_bytes():
        continue
      command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
      found.append((int(entry.name), command.strip()))
    except (OSError, ValueError):  # gone meanwhile
      continue
  return found


def left_after(marker: str, seconds: float) -> list[tuple[int, str]]:
  """`marked(marker)` once it is empty or `seconds` have passed (kernel kills are asynchronous)."""
  deadline = time.monotonic() + seconds
  while (found := marked(marker)) and time.monotonic() < deadline:
    time.sleep(0.1)
  return found


def kill_marked(marker: str) -> None:
  """SIGKILLs what a failed check left behind, so one failure does not load the next test."""
  for pid, _ in marked(marker):
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
