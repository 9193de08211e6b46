"""The run directory: `<logdir>/<name>/<run>/` with config.yaml and status.

A run directory is created once and never reused, so two runs can never mix
their metrics; files inside it are replaced atomically (temp file +
`os.replace`), so a killed run leaves either the old or the new content.
"""

from __future__ import annotations

import errno
import os
import pathlib
import threading
import time
from typing import Any, Mapping

import yaml

from fedsim.errors import UserError
from fedsim.reporting.ownership import parse_writer, this_process

STATUSES = ("running", "completed", "failed", "interrupted")

# What fedsim writes into an experiment directory `<logdir>/<name>/` beside its
# runs: the study's plan, and `fedsim compare`'s TensorBoard run, figures and
# table over seeds. No run (no variant) may take one of these names.
STUDY_FILE = "study.yaml"
COMPARISON_RUN = "comparison"
PLOT_NAME = "accuracy_vs_bits.png"
ROUNDS_PLOT_NAME = "accuracy_vs_rounds.png"
RESULT_NAME = "study_result"  # .md and .csv
EXPERIMENT_ENTRIES = frozenset({STUDY_FILE, COMPARISON_RUN, PLOT_NAME, ROUNDS_PLOT_NAME,
                                f"{RESULT_NAME}.md", f"{RESULT_NAME}.csv"})
# What `read_status` also says: a 'running' run whose process is gone.
KILLED = "killed"
# A full disk (or quota) refuses a new file; an existing file's blocks can
# still be overwritten.
_OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)
# Far below one filesystem block: rewriting a status never needs a new block.
_STATUS_MAX_CHARS = 1000
_PROBE = ".write-probe"


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
  """Replaces the file at `path` with `text` in one step (temp file + rename).

  Raises:
    OSError: if the directory is not writable.
  """
  path = pathlib.Path(path)
  # Per thread too: a forced exit may write a status while the main thread does.
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}-{threading.get_ident()}")
  try:
    with open(tmp, "w", encoding="utf-8", newline="") as f:
      f.write(text)
    os.replace(tmp, path)
  finally:
    # Only left behind when the write or rename failed.
    tmp.unlink(missing_ok=True)


def _check_part(value: str, what: str) -> None:
  # A separator or '..' would put the run outside <logdir>/<name>/.
  if not value or value in (".", "..") or "/" in value or os.sep in value:
    raise UserError(f"{what}: '{value}' is not a valid directory name")


def create_run_dir(logdir: str | os.PathLike, name: str,
                   run: str | None = None) -> pathlib.Path:
  """Creates a new, empty run directory `<logdir>/<name>/<run>/`.

  Args:
    logdir: root of all experiments.
    name: experiment name (one directory level).
    run: run name; defaults to the local time as 'YYYYmmdd-HHMMSS'. If that
      directory exists, '-1', '-2', ... is appended: an existing directory is
      never reused or deleted.

  Returns:
    The path of the created directory.

  Raises:
    UserError: naming the path, if it cannot be created or is not writable.
  """
  _check_part(name, "experiment name")
  if run is not None:
    _check_part(run, "run name")
  parent = pathlib.Path(logdir) / name
  try:
    parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create log directory {parent}: {e.strerror or e}") from None
  base = run if run is not None else time.strftime("%Y%m%d-%H%M%S")
  suffix = 0
  while True:
    run_dir = parent / (base if suffix == 0 else f"{base}-{suffix}")
    try:
      # mkdir without exist_ok is the collision test, so two runs started in
      # the same second cannot both claim one directory.
      run_dir.mkdir()
      break
    except FileExistsError:
      suffix += 1
    except OSError as e:
      raise UserError(f"cannot create run directory {run_dir}: {e.strerror or e}") from None
  probe = run_dir / _PROBE
  try:
    probe.write_text("")
    probe.unlink()
  except OSError as e:
    run_dir.rmdir()  # Created empty just above: nothing of the user's is lost.
    raise UserError(f"run directory {run_dir} is not writable: {e.strerror or e}") from None
  return run_dir


def write_config(run_dir: str | os.PathLike, plain_config: Mapping[str, Any]) -> None:
  """Writes `run_dir/config.yaml` (keys in the given order), atomically.

  Raises:
    OSError: if the file cannot be written.
  """
  text = yaml.safe_dump(dict(plain_config), sort_keys=False, allow_unicode=True)
  write_text_atomic(pathlib.Path(run_dir) / "config.yaml", text)


def write_status(run_dir: str | os.PathLike, status: str, message: str = "") -> None:
  """Writes `run_dir/status`: the status on line 1, then `message` if any,
  then the line naming this process (see `fedsim.reporting.ownership.Writer`).

  The file is replaced atomically; on a full disk, where no new file can be
  written, the existing status file is overwritten in place instead (its
  block is already allocated; a message is cut to 1000 characters to fit).

  Raises:
    ValueError: if `status` is not one of STATUSES.
    OSError: if the file cannot be written either way.
  """
  if status not in STATUSES:
    raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
  message = message.rstrip("\n")[:_STATUS_MAX_CHARS]
  text = status + "\n" + (message + "\n" if message else "") + this_process().line() + "\n"
  path = pathlib.Path(run_dir) / "status"
  try:
    write_text_atomic(path, text)
  except OSError as e:
    if e.errno not in _OUT_OF_SPACE or not path.is_file():
      raise
    _overwrite_in_place(path, text.encode())


def _overwrite_in_place(path: pathlib.Path, data: bytes) -> None:
  """Replaces the content of an existing file without allocating a new one.

  Padded with newlines to the old length before the cut, so a kill between
  the write and the truncation leaves blank lines, which `read_status` ignores,
  rather than the tail of the old status.
  """
  fd = os.open(path, os.O_WRONLY)
  try:
    old_size = os.fstat(fd).st_size
    os.pwrite(fd, data + b"\n" * max(old_size - len(data), 0), 0)
    os.ftruncate(fd, len(data))
  finally:
    os.close(fd)


def mark_interrupted(run_dir: str | os.PathLike) -> None:
  """Marks a run whose status is still 'running', or not yet written, as 'interrupted'.

  For exits that skip the run loop's own handling (`os._exit` after a second
  Ctrl-C, a signal before the loop starts). Raises OSError as `write_status`,
  UserError as `read_status`.
  """
  if read_status(run_dir)[0] in ("running", ""):
    write_status(run_dir, "interrupted")


def mark_failed(run_dir: str | os.PathLike, error: BaseException) -> None:
  """Records `error` as why the run failed, unless this process already wrote
  how it ended (the run loop's own 'failed' with its reason, or 'completed').

  For failures before the loop writes a status (the TFF worker does not
  start): the status would still name an earlier, dead writer and read as
  'killed'. Best effort: a status that cannot be written leaves `error` to
  the caller's report.
  """
  path = pathlib.Path(run_dir) / "status"
  try:
    lines = path.read_text(encoding="utf-8").strip().splitlines()
  except (OSError, UnicodeDecodeError):
    lines = []
  writer = parse_writer(lines[-1]) if lines else None
  if lines and lines[0] in ("failed", "completed") and writer == this_process():
    return
  try:
    write_status(run_dir, "failed", " ".join(str(error).split()) or type(error).__name__)
  except OSError:
    pass


def read_status(run_dir: str | os.PathLike) -> tuple[str, str]:
  """Returns (status, message) of a run; ('', '') if it has no status file.

  A 'running' status whose writer is gone (this host can tell: see
  `ownership.Writer.alive`) reads as 'killed': no one will update it.

  Raises:
    UserError: naming the file, if it exists but cannot be read.
  """
  path = pathlib.Path(run_dir) / "status"
  try:
    text = path.read_text(encoding="utf-8")
  except FileNotFoundError:
    return "", ""
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"{path}: unreadable status file ({e})") from None
  status, _, rest = text.partition("\n")
  lines = rest.rstrip("\n").split("\n")
  # Files written before fedsim recorded the writer end with the message.
  writer = parse_writer(lines[-1])
  message = "\n".join(lines[:-1] if writer else lines).rstrip("\n")
  if status == "running" and writer is not None and writer.alive() is False:
    return KILLED, f"process {writer.pid} ended without recording why (killed?)"
  return status, message
