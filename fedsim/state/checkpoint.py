"""Checkpoints: the whole simulation state after a round, written atomically.

A checkpoint of round R is the directory `run_dir/checkpoints/round_<R>/`:

  server_state.npz  the leaves of the TFF server state (`LearningAlgorithmState`:
                    model, server optimizer, distributor / aggregator / encoder
                    state), in `tf.nest.flatten` order. The structure is not
                    stored: it is that of `process.initialize()` for the same
                    config, which resuming insists on (see `fedsim.experiment.resume`).
  progress.json     the round number, cumulative simulated seconds, the bits of
                    every round so far (SizeInfo histories) and the wall time at
                    which the checkpoint was taken (see `rewind.py`).
  client_states/    hard links to `run_dir/client_states/*.npz` (elastic
                    averaging's local models). The store replaces a client's
                    file with `os.replace`, never in place, so a link keeps the
                    version of round R at no copying cost.
  COMPLETE          written last: the manifest, the size and SHA-256 of
                    every file above (`checkpoint_manifest`).

The sampler and the device model are pure functions of (seed, round), so the
round number is all of their state. Everything is written into a temporary
sibling directory, fsynced, marked COMPLETE and then renamed into place; a
directory without the marker (a kill or a full disk mid-write) is never taken
as a checkpoint, and is deleted by the next write. A checkpoint damaged after
it was written no longer matches its manifest: `intact_checkpoints` passes
over it, so a resume continues from the newest intact one.

`tff.program.FileProgramStateManager` is not used: it writes a TF SavedModel
per version (seconds of graph building for a few arrays) through an async API
that would need a private event loop inside Jupyter, whereas the leaves as
.npz are bit-exact and take milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import time
import zipfile
from typing import Any, Mapping, Sequence

import numpy as np

from fedsim.errors import UserError, host_error
from fedsim.state.checkpoint_manifest import COMPLETE, damage, write_manifest
from fedsim.state.durable import fsync_file, npz_bytes, write_npz, write_synced

CHECKPOINTS = "checkpoints"
SERVER_STATE = "server_state.npz"
PROGRESS = "progress.json"
CONTROL = "control.json"  # a controller's state (fedsim.control.engine)
CLIENT_STATES = "client_states"
_NAME = re.compile(r"round_(\d+)")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """A complete checkpoint on disk and its bookkeeping (no arrays loaded)."""

  path: pathlib.Path
  round_num: int
  simulated_seconds: float
  broadcast_history: tuple[int, ...]
  aggregate_history: tuple[int, ...]
  wall_time: float   # time.time() when it was taken: later log events are rewound

  @property
  def client_states(self) -> pathlib.Path:
    return self.path / CLIENT_STATES

  def control_state(self) -> dict:
    """The controller's saved state.

    Raises:
      UserError: naming the file, if it is missing or unreadable (a run
        checkpointed without a controller cannot resume with one).
    """
    path = self.path / CONTROL
    try:
      state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
      raise UserError(f"{path}: cannot read the controller's state"
                      f" ({type(e).__name__}: {e}); was the run checkpointed without a"
                      " controller?") from None
    if not isinstance(state, dict):
      raise UserError(f"{path}: the controller's state is not a mapping")
    return state

  def server_state(self, template: Any) -> Any:
    """The saved server state, in the structure of `template`.

    Raises:
      UserError: naming the file, if it is unreadable or does not match
        `template` (number or shapes of tensors).
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    expected = tf.nest.flatten(template)
    path = self.path / SERVER_STATE
    try:
      with np.load(path) as f:
        leaves = [f[f"arr_{i}"] for i in range(len(f.files))]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
      raise UserError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e})") from None
    shapes = [np.shape(x) for x in expected]
    if [x.shape for x in leaves] != shapes:
      raise UserError(f"{path}: the checkpointed server state does not match the"
                      f" model and algorithm of the config ({len(leaves)} tensors,"
                      f" expected {len(expected)} with shapes {shapes})")
    return tf.nest.pack_sequence_as(template, leaves)


def _complete_dirs(run_dir: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
  root = pathlib.Path(run_dir) / CHECKPOINTS
  if not root.is_dir():
    return []
  found = []
  for child in root.iterdir():
    match = _NAME.fullmatch(child.name)
    if match and (child / COMPLETE).is_file():
      found.append((int(match.group(1)), child))
  return sorted(found)


def _read(round_num: int, path: pathlib.Path) -> Checkpoint:
  info = json.loads((path / PROGRESS).read_text(encoding="utf-8"))
  return Checkpoint(path=path, round_num=round_num,
                    simulated_seconds=float(info["simulated_seconds"]),
                    broadcast_history=tuple(int(b) for b in info["broadcast_history"]),
                    aggregate_history=tuple(int(b) for b in info["aggregate_history"]),
                    wall_time=float(info["wall_time"]))


def intact_checkpoints(run_dir: str | os.PathLike, hash_all: bool = False
                       ) -> tuple[Checkpoint | None, list[str]]:
  """(the newest intact checkpoint of `run_dir` or None, why each newer one is not).

  A complete checkpoint is intact if its files match its manifest (sizes, and
  digests: all of them when `hash_all`, as a resume checks, else all but the
  client states', as `status` checks) and its progress.json reads. Each reason
  is one line, e.g. 'round_12/server_state.npz: 1024 bytes, 2048 when written'.
  """
  damaged = []
  for round_num, path in reversed(_complete_dirs(pathlib.Path(run_dir))):
    reason = damage(path, hash_all)
    if reason is None:
      try:
        return _read(round_num, path), damaged
      except (OSError, ValueError, KeyError, TypeError) as e:
        reason = f"{PROGRESS}: unreadable ({type(e).__name__})"
    damaged.append(f"{path.name}/{reason}")
  return None, damaged


def latest_checkpoint(run_dir: str | os.PathLike) -> Checkpoint | None:
  """The newest intact checkpoint of `run_dir` (sizes and server state
  checked; see `intact_checkpoints`), or None if it has none."""
  return intact_checkpoints(run_dir)[0]


def save_checkpoint(run_dir: str | os.PathLike, round_num: int, server_state: Any,
                    simulated_seconds: float, broadcast_history: Sequence[int],
                    aggregate_history: Sequence[int], keep: int,
                    client_states: pathlib.Path | None = None,
                    extra_npz: Mapping[str, Mapping[str, Any]] | None = None,
                    control_state: Mapping[str, Any] | None = None) -> pathlib.Path:
  """Writes the checkpoint of `round_num` and deletes all but the newest `keep`.

  `stage_checkpoint(...)`, then its `commit()` and `prune()`: see them for the arguments.

  Returns:
    The checkpoint directory.

  Raises:
    HostError: naming the path, if anything cannot be written (e.g. 'no space
      left on device (writing checkpoint P)'); no directory that would be
      taken as a checkpoint is left behind.
  """
  staged = stage_checkpoint(run_dir, round_num, server_state, simulated_seconds,
                            broadcast_history, aggregate_history, keep, client_states,
                            extra_npz, control_state)
  final = staged.commit()
  staged.prune()
  return final


@dataclasses.dataclass(frozen=True)
class StagedCheckpoint:
  """A checkpoint taken but not yet written: what `commit` writes, fixed when staged.

  Staging keeps what the next round could change (the server state's leaves,
  which the runtime never writes into; the histories and the controller's
  state as text; the client states as hard links, since the store replaces
  their files when it next saves), so `commit` may run on another thread
  while the run goes on (`fedsim.state.checkpoint_writer`).
  """

  run_dir: pathlib.Path
  round_num: int
  tmp: pathlib.Path
  leaves: tuple[Any, ...]
  progress: str
  extra_npz: Mapping[str, bytes]
  control: str | None
  keep: int
  linked: bool  # `tmp` exists, holding the client states' links

  @property
  def final(self) -> pathlib.Path:
    return self.run_dir / CHECKPOINTS / f"round_{self.round_num}"

  def commit(self) -> pathlib.Path:
    """Writes the staged files, fsynced, marks them COMPLETE and renames the
    directory into place: the checkpoint is durable when this returns.

    Returns:
      The checkpoint directory.

    Raises:
      HostError: as `save_checkpoint`.
    """
    root, tmp, final = self.tmp.parent, self.tmp, self.final
    try:
      if not self.linked:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a killed process of the same pid
        tmp.mkdir(parents=True)
      write_npz(tmp / SERVER_STATE, [np.asarray(x) for x in self.leaves], sync=True)
      write_synced(tmp / PROGRESS, self.progress)
      for name, data in self.extra_npz.items():
        write_synced(tmp / name, data)
      if self.control is not None:
        write_synced(tmp / CONTROL, self.control)
      previous = _complete_dirs(self.run_dir)
      write_manifest(tmp, self.round_num, previous[-1][1] if previous else None)
      fsync_file(tmp)
      if final.exists():  # Left by an earlier life of this run at the same round.
        shutil.rmtree(final)
      os.rename(tmp, final)
      fsync_file(root)
    except OSError as e:
      shutil.rmtree(tmp, ignore_errors=True)
      raise host_error(OSError(e.errno, e.strerror or str(e)), final,
                       "writing checkpoint") from None
    return final

  def prune(self) -> None:
    """After `commit`: deletes all but the newest `keep` complete checkpoints,
    and what writes that died half way left. Apart from `commit` because a
    deletion makes nothing durable (on ext4 it took ~10 ms of a ~30 ms W2
    write): `fedsim.state.checkpoint_writer` lets the loop go on before it.
    The next checkpoint must be staged only after it (it deletes staging
    directories)."""
    _prune(self.run_dir / CHECKPOINTS, self.keep)


def stage_checkpoint(run_dir: str | os.PathLike, round_num: int, server_state: Any,
                     simulated_seconds: float, broadcast_history: Sequence[int],
                     aggregate_history: Sequence[int], keep: int,
                     client_states: pathlib.Path | None = None,
                     extra_npz: Mapping[str, Mapping[str, Any]] | None = None,
                     control_state: Mapping[str, Any] | None = None) -> StagedCheckpoint:
  """Takes the checkpoint of `round_num` (its temporary directory, client-state
  links and bookkeeping); `commit()` writes it.

  Args:
    run_dir: the run directory.
    round_num: the round just completed.
    server_state: what `process.next` returned as state (numpy leaves).
    simulated_seconds: cumulative simulated time after this round.
    broadcast_history, aggregate_history: bits of every round so far.
    keep: how many checkpoints to keep (>= 1).
    client_states: the directory of per-client .npz files, if any.
    extra_npz: file name -> named arrays, written into the checkpoint too
      (the asynchronous loop's clients in flight).
    control_state: a controller's state (JSON), if the run has one.

  Raises:
    HostError: as `save_checkpoint`.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  run_dir = pathlib.Path(run_dir)
  root = run_dir / CHECKPOINTS
  tmp = root / f".round_{round_num}.tmp{os.getpid()}"
  try:
    if client_states is not None:  # now: the store replaces these files when it next saves
      shutil.rmtree(tmp, ignore_errors=True)
      tmp.mkdir(parents=True)
      _link_client_states(client_states, tmp / CLIENT_STATES)
  except OSError as e:
    shutil.rmtree(tmp, ignore_errors=True)
    raise host_error(OSError(e.errno, e.strerror or str(e)), root / f"round_{round_num}",
                     "writing checkpoint") from None
  return StagedCheckpoint(
      run_dir=run_dir, round_num=round_num, tmp=tmp,
      leaves=tuple(tf.nest.flatten(server_state)),
      progress=json.dumps({
          "round": round_num, "simulated_seconds": simulated_seconds,
          "broadcast_history": [int(b) for b in broadcast_history],
          "aggregate_history": [int(b) for b in aggregate_history],
          "wall_time": time.time()}),  # now: the logs' rewind cuts what comes after
      extra_npz={name: npz_bytes(arrays) for name, arrays in (extra_npz or {}).items()},
      # repr-exact floats: a resumed controller decides exactly as it would have.
      control=None if control_state is None else json.dumps(control_state),
      keep=keep, linked=client_states is not None)


def _link_client_states(source: pathlib.Path, target: pathlib.Path) -> None:
  target.mkdir()
  if not source.is_dir():
    return
  for path in source.iterdir():
    # `*.tmp.npz` is a save that a kill interrupted: not a client state.
    if path.suffix == ".npz" and not path.name.endswith(".tmp.npz"):
      os.link(path, target / path.name)


def restore_client_states(checkpoint: Checkpoint, directory: pathlib.Path) -> None:
  """Makes `directory` hold exactly the client states of `checkpoint`.

  Files are hard-linked, not copied; the store replaces files rather than
  writing into them, so the checkpoint's versions stay intact.
  """
  staging = directory.with_name(f".{directory.name}.restore")
  retired = directory.with_name(f".{directory.name}.old")
  for leftover in (staging, retired):  # From a kill during an earlier restore.
    shutil.rmtree(leftover, ignore_errors=True)
  _link_client_states(checkpoint.client_states, staging)
  if directory.exists():
    os.rename(directory, retired)
  os.rename(staging, directory)
  shutil.rmtree(retired, ignore_errors=True)


def _prune(root: pathlib.Path, keep: int) -> None:
  for child in root.iterdir():
    if child.name.startswith(".round_"):  # A write that died half way.
      shutil.rmtree(child, ignore_errors=True)
  complete = _complete_dirs(root.parent)
  for _, path in complete[:max(len(complete) - keep, 0)]:
    shutil.rmtree(path, ignore_errors=True)
