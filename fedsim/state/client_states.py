"""Per-client state (error-feedback residuals, control variates, local models)
kept between the rounds a client takes part in, with the round each was last saved in.

States live in memory up to a byte budget, the most recently used first; a
state pushed out of the budget is spilled to one `.npz` file per client in the
run directory, and read back when its client is sampled again. Before a
checkpoint `flush` writes every state changed since the last one, so the
directory (which the checkpoint links) holds the states of that round: a
resumed run reads them back bit for bit. A client never seen starts from the
algorithm's initial client state.
"""

from __future__ import annotations

import collections
import os
import pathlib
from typing import Any, Sequence

import numpy as np

from fedsim.state.durable import write_npz

_UPDATED = "updated_round"   # the .npz entry holding the round a state was saved in
DEFAULT_MEMORY_BYTES = 1 << 30


class ClientStateStore:
  """Loads and saves client states as flat lists of arrays, in memory and in `directory`."""

  def __init__(self, directory: str | os.PathLike, initial_state: Any,
               memory_bytes: int = DEFAULT_MEMORY_BYTES):
    """`memory_bytes` bounds the states held in memory (0: every state on disk)."""
    self.directory = pathlib.Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self._template = initial_state
    self._initial = [np.asarray(a) for a in _leaves(initial_state)]
    self._capacity = memory_bytes // max(self.bytes_per_client(), 1)
    # client id -> (leaves, round last updated or None), least recently used first.
    self._memory: collections.OrderedDict[str, tuple[list, int | None]] = (
        collections.OrderedDict())
    self._dirty: set[str] = set()   # in memory, newer than its file

  def _path(self, client_id: str) -> pathlib.Path:
    return self.directory / f"{client_id}.npz"

  def load(self, client_ids: Sequence[str]) -> list[Any]:
    """The state of each client, in the structure of the initial state."""
    return [_pack(self._template, iter(self._entry(cid)[0])) for cid in client_ids]

  def save(self, client_ids: Sequence[str], states: Sequence[Any],
           round_num: int | None = None) -> None:
    """Keeps each client's new state (in memory; spilled to disk past the budget),
    with `round_num` as the round it was last updated (see `last_updated`).

    Raises:
      ValueError: a state with another number of tensors than the initial one.
      OSError: a spilled state could not be written.
    """
    for cid, state in zip(client_ids, states):
      leaves = [np.asarray(a) for a in _leaves(state)]
      if len(leaves) != len(self._initial):
        raise ValueError(f"client state of {cid} has {len(leaves)} tensors,"
                         f" expected {len(self._initial)}")
      self._memory[cid] = (leaves, round_num)
      self._memory.move_to_end(cid)
      self._dirty.add(cid)
    self._spill()

  def flush(self) -> None:
    """Writes every state changed since the last flush to its file (before a checkpoint).

    Raises:
      OSError: a file could not be written.
    """
    for cid in sorted(self._dirty):
      self._write(cid, *self._memory[cid])
    self._dirty.clear()

  def last_updated(self, client_ids: Sequence[str]) -> list[int | None]:
    """The round each client's state was last saved in; None if it never was
    (or was saved without a round)."""
    return [self._entry(cid)[1] for cid in client_ids]

  def bytes_per_client(self) -> int:
    """Bytes of one client's state (array payload, without file overhead)."""
    return int(sum(a.nbytes for a in self._initial))

  def _entry(self, cid: str) -> tuple[list, int | None]:
    """(leaves, round updated) from memory, else from its file (then kept in
    memory), else the initial state."""
    if cid in self._memory:
      self._memory.move_to_end(cid)
      return self._memory[cid]
    path = self._path(cid)
    if not path.exists():
      return self._initial, None
    with np.load(path) as f:
      entry = ([f[f"arr_{i}"] for i in range(len(self._initial))],
               int(f[_UPDATED]) if _UPDATED in f.files else None)
    if self._capacity:
      self._memory[cid] = entry
      self._spill()
    return entry

  def _spill(self) -> None:
    """Writes out (if changed) and forgets the least recently used states past the budget."""
    while len(self._memory) > self._capacity:
      cid, entry = self._memory.popitem(last=False)
      if cid in self._dirty:
        self._write(cid, *entry)
        self._dirty.discard(cid)

  def _write(self, cid: str, leaves: list, updated: int | None) -> None:
    arrays = {f"arr_{i}": leaf for i, leaf in enumerate(leaves)}
    if updated is not None:
      arrays[_UPDATED] = np.int64(updated)
    tmp = self._path(cid).with_suffix(".tmp.npz")
    write_npz(tmp, arrays)  # A full disk: one OSError, no stray ZipFile finalizer.
    os.replace(tmp, self._path(cid))  # atomic: a kill never leaves half a file


def _pack(template: Any, leaves) -> Any:
  """Inverse of `_leaves`: rebuilds `template`'s structure from `leaves`."""
  if isinstance(template, dict):
    return type(template)((k, _pack(v, leaves)) for k, v in template.items())
  if isinstance(template, (list, tuple)):
    return type(template)(_pack(v, leaves) for v in template)
  return next(leaves)


def _leaves(state: Any) -> list[Any]:
  """Flattens a state in insertion order (TFF returns nested OrderedDicts /
  lists / tuples in the order of its type, which tf.nest would re-sort)."""
  if hasattr(state, "_asdict"):
    state = state._asdict()
  if isinstance(state, dict):
    return [leaf for v in state.values() for leaf in _leaves(v)]
  if isinstance(state, (list, tuple)):
    return [leaf for v in state for leaf in _leaves(v)]
  return [state]
