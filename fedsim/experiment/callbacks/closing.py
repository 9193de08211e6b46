"""Closing a failing run's sinks without hiding why it failed."""

from __future__ import annotations


def close_quietly(*sinks) -> None:
  """Closes each sink that was opened (not None), ignoring their own errors:
  on a failing run, a sink's error would hide the first one."""
  for sink in sinks:
    if sink is None:
      continue
    try:
      sink.close()
    except Exception:  # pylint: disable=broad-except
      pass
