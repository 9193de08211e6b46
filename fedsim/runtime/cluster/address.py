"""Where a `ray` runtime's cluster is: `runtime.address` checked, resolved and probed."""

from __future__ import annotations

import re
import socket

from fedsim.errors import UserError

_CONNECT_TIMEOUT_S = 5.0
_ADDRESS = re.compile(r"^(?P<host>[^\s:]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})$")


def auto_address(key: str = "runtime.address") -> str:
  """The address `ray start` left on this machine (or RAY_ADDRESS), for `address: auto`."""
  from ray._private import services  # pylint: disable=g-import-not-at-top
  try:
    return services.canonicalize_bootstrap_address("auto")
  except ConnectionError:
    raise UserError(f"{key}: auto, but no Ray cluster was started on this machine"
                    " (run `ray start --head` or `ray start --address HEAD:6379` first)") from None


def check_address(address: str, key: str = "runtime.address") -> tuple[str, int] | None:
  """`(host, port)` of a 'HOST:PORT' address; None for 'local' and 'auto'.

  Raises:
    UserError: anything else, naming `key`.
  """
  if address in ("local", "auto"):
    return None
  match = _ADDRESS.match(address)
  if match is None or not 0 < int(match["port"]) < 65536:
    raise UserError(f"{key}: '{address}' is not local, auto or HOST:PORT")
  return match["host"].strip("[]"), int(match["port"])


def answers(address: str) -> bool:
  """Whether something accepts a TCP connection at HOST:PORT (within a second)."""
  host, port = address.rsplit(":", 1)
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
      return True
  except OSError:
    return False


def check_reachable(target: str, configured: str, key: str = "runtime.address") -> None:
  """UserError naming `key` when nothing listens at `target` (Ray itself would retry for minutes)."""
  host, port = check_address(target, key)
  try:
    with socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S):
      pass
  except OSError as e:
    reason = e.strerror or type(e).__name__
    shown = configured if configured == target else f"{configured} ({target})"
    raise UserError(f"{key}: no Ray cluster answers at {shown}: {reason}") from None
