"""A checkpoint's manifest: the size and SHA-256 of each of its files.

The manifest is the checkpoint's `COMPLETE` marker, written last into the
temporary directory that is then renamed into place, so a checkpoint either
has its whole manifest or is not a checkpoint. A file that was truncated,
flipped, removed or added afterwards (a failing disk, a user's edit, a copy
that stopped half way) no longer matches it, and `--resume` falls back to an
older checkpoint instead of reading it (see `checkpoint.intact_checkpoints`).

Client-state files are hard links shared with the previous checkpoint when
unchanged, so their digest is taken from the previous manifest when the file
is the same inode with the same size and mtime: a checkpoint hashes only the
states written since the last one.

A checkpoint whose COMPLETE holds only 'round R' (written before manifests
existed) is trusted as it is. Imports no TensorFlow.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

COMPLETE = "COMPLETE"
_CHUNK = 1 << 20


def _sha256(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      digest.update(chunk)
  return digest.hexdigest()


def _files(directory: pathlib.Path) -> list[pathlib.Path]:
  return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != COMPLETE)


def read_manifest(directory: pathlib.Path) -> dict[str, Any] | None:
  """The manifest of checkpoint `directory`; None for one written before manifests.

  Raises:
    ValueError: if COMPLETE is neither a manifest nor the old marker.
    OSError: if it cannot be read.
  """
  raw = (directory / COMPLETE).read_bytes()
  if raw.startswith(b"round ") and raw.count(b"\n") <= 1:
    return None  # the marker of checkpoints written before manifests
  manifest = json.loads(raw.decode("utf-8"))
  if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
    raise ValueError("COMPLETE is not a checkpoint manifest")
  return manifest


def write_manifest(directory: pathlib.Path, round_num: int,
                   previous: pathlib.Path | None) -> None:
  """Writes (and fsyncs) `directory/COMPLETE` listing every file below it.

  Args:
    directory: the checkpoint being written, every other file in place.
    round_num: its round.
    previous: the newest complete checkpoint, whose digests of unchanged
      hard-linked files are reused (None: hash everything).

  Raises:
    OSError: if a file cannot be read or the manifest written.
  """
  known = {}
  if previous is not None:
    try:
      known = {(e["inode"], e["size"], e["mtime_ns"]): e["sha256"]
               for e in (read_manifest(previous) or {"files": {}})["files"].values()
               if "inode" in e}
    except (OSError, ValueError, KeyError, TypeError):
      known = {}  # a damaged previous manifest: hash everything again
  files = {}
  for path in _files(directory):
    stat = path.stat()
    entry = {"size": stat.st_size, "inode": stat.st_ino, "mtime_ns": stat.st_mtime_ns}
    entry["sha256"] = known.get((stat.st_ino, stat.st_size, stat.st_mtime_ns)) or _sha256(path)
    files[path.relative_to(directory).as_posix()] = entry
  text = json.dumps({"round": round_num, "files": files}, sort_keys=True)
  with open(directory / COMPLETE, "w", encoding="utf-8") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())


def damage(directory: pathlib.Path, hash_all: bool) -> str | None:
  """Why checkpoint `directory` does not match its manifest, or None if it does.

  Every file's presence and size is checked, and no file may have been added;
  the digest of every file is checked when `hash_all`, else only those outside
  `client_states/` (the server state and bookkeeping: a few MB, cheap enough
  for `fedsim status`; the client states can be thousands of files).
  """
  try:
    manifest = read_manifest(directory)
  except (OSError, ValueError) as e:
    return f"{COMPLETE}: unreadable manifest ({type(e).__name__})"
  if manifest is None:
    return None
  listed = manifest["files"]
  present = {p.relative_to(directory).as_posix(): p for p in _files(directory)}
  for name in sorted(set(listed) - set(present)):
    return f"{name}: missing"
  for name in sorted(set(present) - set(listed)):
    return f"{name}: not in the checkpoint's manifest"
  for name, entry in sorted(listed.items()):
    try:
      size = present[name].stat().st_size
      if size != entry["size"]:
        return f"{name}: {size} bytes, {entry['size']} when written"
      if (hash_all or not name.startswith("client_states/")) and (
          _sha256(present[name]) != entry["sha256"]):
        return f"{name}: content differs from when it was written (SHA-256)"
    except (OSError, KeyError, TypeError) as e:
      return f"{name}: unreadable ({type(e).__name__})"
  return None
