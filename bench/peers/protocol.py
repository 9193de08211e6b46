"""What a run prints for the driver: one marked JSON object per line on stdout.

Libraries print their own logs to the same stream; the mark tells ours apart.
A round's record is {"round": r, "t": wall seconds (time.time()) at its end,
"loss": mean training loss of the round's clients}, plus what the framework
itself measures (fedsim: "round_seconds").
"""

from __future__ import annotations

import json

MARK = "@peers "


def emit(**fields) -> None:
  print(MARK + json.dumps(fields), flush=True)


def parse(line: str) -> dict | None:
  return json.loads(line[len(MARK):]) if line.startswith(MARK) else None

