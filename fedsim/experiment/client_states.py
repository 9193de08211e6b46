"""Per-client state (e.g. elastic averaging's local models) kept on disk.

A population of thousands of clients cannot hold its local models in RAM at
once, so each client's state is one `.npz` file in the run directory, read
when the client is sampled and written back after the round; a client never
seen starts from the algorithm's initial client state.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Sequence

import numpy as np

from fedsim.experiment.checkpoint import write_npz


class ClientStateStore:
  """Loads and saves client states as flat lists of arrays in `directory`."""

  def __init__(self, directory: str | os.PathLike, initial_state: Any):
    self.directory = pathlib.Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self._template = initial_state
    self._initial = [np.asarray(a) for a in _leaves(initial_state)]

  def _path(self, client_id: str) -> pathlib.Path:
    return self.directory / f"{client_id}.npz"

  def load(self, client_ids: Sequence[str]) -> list[Any]:
    """The state of each client, in the structure of the initial state."""
    states = []
    for cid in client_ids:
      path = self._path(cid)
      if path.exists():
        with np.load(path) as f:
          leaves = [f[f"arr_{i}"] for i in range(len(self._initial))]
      else:
        leaves = self._initial
      states.append(_pack(self._template, iter(leaves)))
    return states

  def save(self, client_ids: Sequence[str], states: Sequence[Any]) -> None:
    """Writes each client's new state atomically (a kill never leaves half a file)."""
    for cid, state in zip(client_ids, states):
      leaves = [np.asarray(a) for a in _leaves(state)]
      if len(leaves) != len(self._initial):
        raise ValueError(f"client state of {cid} has {len(leaves)} tensors,"
                         f" expected {len(self._initial)}")
      tmp = self._path(cid).with_suffix(".tmp.npz")
      write_npz(tmp, leaves)  # A full disk: one OSError, no stray ZipFile finalizer.
      os.replace(tmp, self._path(cid))

  def bytes_per_client(self) -> int:
    """Disk bytes of one client's state (array payload, without file overhead)."""
    return int(sum(a.nbytes for a in self._initial))


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
