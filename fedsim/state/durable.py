"""Files a run writes so that a crash or a full disk leaves no half-written one,
and the disk space a run needs: what checkpoints and the client-state store share."""

from __future__ import annotations

import io
import os
import pathlib
import shutil
from typing import Any, Mapping, Sequence

import numpy as np

from fedsim.errors import UserError


def fsync_file(path: pathlib.Path) -> None:
  """fsync of a file or directory (a rename is durable once its directory is)."""
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def npz_bytes(arrays: Sequence[Any] | Mapping[str, Any]) -> bytes:
  """`arrays` in np.savez's format (`arr_<i>`, or the mapping's names), in memory."""
  buffer = io.BytesIO()
  if isinstance(arrays, Mapping):
    np.savez(buffer, **arrays)
  else:
    np.savez(buffer, *arrays)
  return buffer.getvalue()


def write_npz(path: str | os.PathLike, arrays: Sequence[Any] | Mapping[str, Any],
              sync: bool = False) -> None:
  """Writes `arrays` to `path` in np.savez's format (`npz_bytes`).

  The archive is built in memory first: np.savez streaming into a file that
  fills up leaves a half-written ZipFile, whose finalizer later prints a
  traceback of its own; this way a full disk is just one OSError.

  Raises:
    OSError: if the file cannot be written.
  """
  data = npz_bytes(arrays)
  with open(path, "wb") as f:
    f.write(data)
    if sync:
      f.flush()
      os.fsync(f.fileno())


def write_synced(path: pathlib.Path, content: str | bytes) -> None:
  """Writes `content` (text as UTF-8) to `path` and fsyncs it."""
  with open(path, "wb") as f:
    f.write(content.encode("utf-8") if isinstance(content, str) else content)
    f.flush()
    os.fsync(f.fileno())


def state_bytes(server_state: Any) -> int:
  """Bytes of the arrays of a server state (what server_state.npz holds)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return int(sum(np.asarray(x).nbytes for x in tf.nest.flatten(server_state)))


def check_free_space(run_dir: pathlib.Path, needed: int) -> None:
  """Raises UserError naming `run_dir` if its disk has fewer than `needed` bytes free."""
  free = shutil.disk_usage(run_dir).free
  if free < needed:
    raise UserError(f"checkpoint: {run_dir} has {free / 2**20:.1f} MiB free, but this"
                    f" run's checkpoints and logs need about {needed / 2**20:.1f} MiB"
                    " (lower checkpoint.keep or free some space)")
