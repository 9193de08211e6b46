"""How this process was started, so that the commands fedsim prints work when copied.

`fedsim` started through `uv run` is not on the shell's PATH: a printed
`fedsim run --resume ...` or `tensorboard --logdir ...` then fails with
'command not found'. uv sets `UV` (its own path) and `UV_RUN_RECURSION_DEPTH`
in the environment of what it runs (checked with uv 0.13); both are inherited
by grandchildren too, so uv counts only when it is this process's parent.
Imports nothing of fedsim.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import sys
from typing import Sequence


def command(tool: str, args: Sequence[str] = ()) -> str:
  """The shell line that runs `tool` (e.g. 'fedsim', 'tensorboard') with `args`
  the way this process was started: `uv run fedsim ...` under uv, the
  script's own path when its directory is not on PATH, else `fedsim ...`."""
  return shlex.join([*prefix(tool), *args])


def prefix(tool: str) -> list[str]:
  """The words before `tool`'s arguments (see `command`). In a process that is
  not fedsim's own (a test runner, a notebook calling `fedsim.cli.main`), the
  plain tool name."""
  module = _fedsim_module()
  if module is None and not _is_fedsim_script():
    return [tool]
  words = ["python", "-m", module] if module is not None and tool == "fedsim" else [tool]
  if _started_by_uv():
    return ["uv", "run", *words]
  if words[0] == "python":  # that interpreter, under the name the shell finds it by
    python = shutil.which("python")
    return ["python" if python and _same_file(python, sys.executable) else sys.executable,
            *words[1:]]
  # A virtualenv's bin/ (where this interpreter and its scripts live) that PATH does not reach.
  sibling = pathlib.Path(sys.executable).parent / tool
  found = shutil.which(tool)
  if sibling.is_file() and not (found and _same_file(found, sibling)):
    return [str(sibling)]
  return [tool]


def _fedsim_module() -> str | None:
  """'fedsim.cli' when this process runs `python -m fedsim.cli`, else None."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  name = getattr(spec, "name", None) or ""
  return name if name.split(".")[0] == "fedsim" else None


def _is_fedsim_script() -> bool:
  return bool(sys.argv) and os.path.basename(sys.argv[0]) == "fedsim"


def _started_by_uv() -> bool:
  if "UV_RUN_RECURSION_DEPTH" not in os.environ and "UV" not in os.environ:
    return False
  try:
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
      words = f.read().split(b"\0")
  except OSError:
    return False
  return len(words) > 1 and os.path.basename(words[0]) == b"uv" and words[1] == b"run"


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
  try:
    return os.path.samefile(a, b)
  except OSError:
    return False
