"""What a failed Ray call says, in one line: which worker, and the error that ended it."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The last line of a Python traceback: 'package.module.SomeError: message'.
_RAISED = re.compile(r"^(?:[A-Za-z_][\w]*\.)*(?P<kind>[A-Za-z_]\w*(?:Error|Exception|Exit)):"
                     r" (?P<message>.+)$")


def failed_worker(refs: list, ray, workers: list[int], kind: type) -> str:
  """The worker (chunk) index of the first call that raised `kind` (e.g. its
  actor died: RayActorError), for the message."""
  for worker, ref in zip(workers, refs):
    try:
      ray.get(ref, timeout=0)
    except kind:
      return str(worker)
    except Exception:  # pylint: disable=broad-except
      continue
  return "?"


def actor_cause(error) -> str:
  """The error that ended an actor, one line: the Python exception its
  traceback ends with (e.g. 'UserError: data.path: ...'), else Ray's first line."""
  text = _ANSI.sub("", str(error))
  raised = [m for m in map(_RAISED.match, text.splitlines()) if m]
  if raised:
    return f"{raised[-1]['kind']}: {raised[-1]['message']}"
  return first_line(text)


def first_line(error: BaseException | str) -> str:
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__
