"""Exceptions that the CLI turns into exit codes.

`UserError` is bad input (config, file, value): one line on stderr, exit 2.
`RunFailed` is a run that started but could not finish (divergence, a dead
worker): one line on stderr, exit 1. `HostError` is the machine refusing
(a full disk, an unwritable file): one `fedsim: error:` line, exit 1.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os


class UserError(Exception):
  """Bad input from the user. The message names the culprit in one line."""

  exit_code = 2


class RunFailed(Exception):
  """A run that could not finish; what was written so far stays on disk."""

  exit_code = 1


class HostError(Exception):
  """The environment stopped fedsim (disk full, file unwritable); one line.

  A run stopped by it can be resumed once the cause is fixed.
  """

  exit_code = 1


def host_error(error: OSError, path: str | os.PathLike | None = None,
               doing: str = "writing") -> HostError:
  """A HostError saying what `error` means, e.g. 'no space left on device (writing P)'.

  `path` is used when the error names no file of its own.
  """
  reason = error.strerror or str(error) or os.strerror(errno.EIO)
  where = error.filename if error.filename is not None else path
  reason = reason[:1].lower() + reason[1:]
  return HostError(f"{reason} ({doing} {os.fspath(where)})" if where is not None else reason)


def one_line(error: BaseException) -> str:
  """'<ExceptionType>: <message on one line>', for errors raised by user code."""
  text = " ".join(str(error).split()) or "(no message)"
  return f"{type(error).__name__}: {text}"
