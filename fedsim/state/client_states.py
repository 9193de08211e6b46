"""Per-client state (error-feedback residuals, control variates, local models)
kept between the rounds a client takes part in, with the round each was last saved in.

States live in memory up to a byte budget, the most recently used first; a
state pushed out of the budget is spilled to one `.npz` file per client in the
run directory, and read back when its client is sampled again. Before a
checkpoint `flush` writes every state changed since the last one, so the
directory (which the checkpoint links) holds the states of that round: a
resumed run reads them back bit for bit. A client never seen starts from the
algorithm's initial client state.

A compiled round returns its clients' new states as rows of one buffer per
state tensor (and per graph call), which the store keeps as they are: the next
round with the same clients in the same order then reads them without a copy.
A buffer lives while any of its rows is kept, so once the rows the store still
holds are less than half of it, they are copied out and the buffer freed: the
buffers kept alive are at most twice the states held.
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
    # id of a buffer kept states are rows of -> (buffer, {(client id, leaf index)
    # of those rows}, their bytes); see `_hold` and `_compact`.
    self._buffers: dict[int, tuple[np.ndarray, set, list[int]]] = {}
    self._changed: set[int] = set()  # buffers that gained or lost rows since `_compact`

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
      if cid in self._memory:
        self._release(cid, self._memory[cid][0])
      self._memory[cid] = (leaves, round_num)
      self._memory.move_to_end(cid)
      self._hold(cid, leaves)
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
      self._memory[cid] = entry  # its own arrays: no buffer to hold
      self._spill()
    return entry

  def _spill(self) -> None:
    """Writes out (if changed) and forgets the least recently used states past the budget."""
    while len(self._memory) > self._capacity:
      cid, entry = self._memory.popitem(last=False)
      if cid in self._dirty:
        self._write(cid, *entry)
        self._dirty.discard(cid)
      self._release(cid, entry[0])
    self._compact()

  def _hold(self, cid: str, leaves: list) -> None:
    """Counts `cid`'s leaves that are rows of a larger buffer toward that buffer."""
    for i, leaf in enumerate(leaves):
      base = leaf.base
      if isinstance(base, np.ndarray) and base.nbytes > leaf.nbytes:
        _, rows, held = self._buffers.setdefault(id(base), (base, set(), [0]))
        rows.add((cid, i))
        held[0] += leaf.nbytes
        self._changed.add(id(base))

  def _release(self, cid: str, leaves: list) -> None:
    """Uncounts `cid`'s rows (replaced or spilled); `_compact` then checks their buffers."""
    for i, leaf in enumerate(leaves):
      found = self._buffers.get(id(leaf.base))
      if found is not None and (cid, i) in found[1]:
        found[1].discard((cid, i))
        found[2][0] -= leaf.nbytes
        self._changed.add(id(leaf.base))

  def _compact(self) -> None:
    """Frees each changed buffer now held less than half (its rows a save took
    only some of, or lost since): its remaining rows are copied out. Run after
    a whole save, so that a round replacing every row of a buffer (full
    participation) copies none."""
    for key in self._changed:
      base, rows, held = self._buffers[key]
      if 2 * held[0] >= base.nbytes:
        continue
      del self._buffers[key]
      for cid, i in rows:
        self._memory[cid][0][i] = self._memory[cid][0][i].copy()
    self._changed.clear()

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
