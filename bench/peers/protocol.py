"""What a run prints for the driver: one marked JSON object per line on stdout.

Libraries print their own logs to the same stream; the mark tells ours apart.
A round's record is {"round": r, "t": wall seconds (time.time()) at its end,
"loss": mean training loss of the round's clients}, plus what the framework
itself measures (fedsim: "round_seconds").
"""

from __future__ import annotations

import json
import sys

MARK = "@peers "


def emit(**fields) -> None:
  print(MARK + json.dumps(fields), flush=True)


def parse(line: str) -> dict | None:
  return json.loads(line[len(MARK):]) if line.startswith(MARK) else None


def loss_falls(records: list[dict]) -> bool:
  """The last round's training loss is below the first's (both finite)."""
  losses = [r["loss"] for r in records if r.get("loss") is not None]
  return len(losses) >= 2 and all(l == l for l in losses) and losses[-1] < losses[0]


if __name__ == "__main__":
  sys.exit("imported by the runs and the driver")
