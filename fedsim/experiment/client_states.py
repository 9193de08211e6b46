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

_UPDATED = "updated_round"   # the .npz entry holding the round a state was saved in
_AGE = "error_feedback/residual_age"


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

  def save(self, client_ids: Sequence[str], states: Sequence[Any],
           round_num: int | None = None) -> dict[str, float]:
    """Writes each client's new state atomically (a kill never leaves half a file).

    With `round_num`, each file also records it as the round its state was
    last updated, and the states it replaces are measured: when the state
    holds an error-feedback `residual`, the result has
    `error_feedback/residual_age_mean` and `_max`, the rounds since each
    client's replaced residual was last updated (round_num - the round saved
    in its file), over the clients that carried one (a client seen for the
    first time carries none; if none did, the keys are left out).

    Returns:
      Those metrics, or {}.
    """
    ages = [round_num - saved for saved in self.last_updated(client_ids)
            if saved is not None] if round_num is not None else []
    for cid, state in zip(client_ids, states):
      leaves = [np.asarray(a) for a in _leaves(state)]
      if len(leaves) != len(self._initial):
        raise ValueError(f"client state of {cid} has {len(leaves)} tensors,"
                         f" expected {len(self._initial)}")
      arrays = {f"arr_{i}": leaf for i, leaf in enumerate(leaves)}
      if round_num is not None:
        arrays[_UPDATED] = np.int64(round_num)
      tmp = self._path(cid).with_suffix(".tmp.npz")
      write_npz(tmp, arrays)  # A full disk: one OSError, no stray ZipFile finalizer.
      os.replace(tmp, self._path(cid))
    if not ages or not _has_residual(self._template):
      return {}
    return {f"{_AGE}_mean": float(np.mean(ages)), f"{_AGE}_max": float(max(ages))}

  def last_updated(self, client_ids: Sequence[str]) -> list[int | None]:
    """The round each client's state was last saved in; None if it never was
    (or was saved without a round)."""
    out = []
    for cid in client_ids:
      path = self._path(cid)
      saved = None
      if path.exists():
        with np.load(path) as f:
          if _UPDATED in f.files:
            saved = int(f[_UPDATED])
      out.append(saved)
    return out

  def bytes_per_client(self) -> int:
    """Disk bytes of one client's state (array payload, without file overhead)."""
    return int(sum(a.nbytes for a in self._initial))


def _has_residual(state: Any) -> bool:
  """True if the client state keeps an error-feedback residual (see
  `fedsim.learning.client_work`: the entry `residual`)."""
  return isinstance(state, dict) and "residual" in state


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
