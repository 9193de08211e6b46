"""Exceptions that the CLI turns into exit codes.

`UserError` is bad input (config, file, value): one line on stderr, exit 2.
`RunFailed` is a run that started but could not finish (divergence, a dead
worker): one line on stderr, exit 1. Anything else is a bug and keeps its
traceback.
"""


class UserError(Exception):
  """Bad input from the user. The message names the culprit in one line."""

  exit_code = 2


class RunFailed(Exception):
  """A run that could not finish; what was written so far stays on disk."""

  exit_code = 1
