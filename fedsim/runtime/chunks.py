"""A round's clients as the compiled client loop reads them: chunks of concatenated leaves.

Each client's data (and, when the clients keep state, its state) is flattened
into leaves; clients are grouped into chunks, each bounded apart in client
data bytes and in client state bytes, and a chunk's clients are laid end to
end per leaf, with the offsets where each starts, so one graph call runs the
whole chunk and each iteration slices its client back out.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

from fedsim.backend import computations


class ChunkBounds(NamedTuple):
  """Most bytes of a round's clients one chunk (graph call) holds; a chunk takes
  at least one client, however large."""
  data: int     # client data
  states: int   # client states: the last `state_leaves` leaves of each client


def chunks(client_data: Sequence[Any], data_type, data_leaves, bounds: ChunkBounds,
           state_leaves: int = 0) -> Iterator[list[list[np.ndarray]]]:
  """Lists of clients, each a list of its data leaves as arrays of the leaf types.

  The last `state_leaves` leaves of a client are its state (a stateful round
  reads `(data, state)` pairs): they count toward `bounds.states`, the others
  toward `bounds.data`. Clients are read one at a time (a lazily packed round
  is never held at once). Scalar leaves become shape [1], so that every leaf
  concatenates on axis 0.
  """
  flatten = computations.flattener(data_type)
  shapes = [(np.dtype(t.dtype), (-1, *t.shape[1:]) if t.shape else (1,)) for t in data_leaves]
  split = len(data_leaves) - state_leaves
  chunk, data_size, state_size = [], 0, 0
  for client in client_data:
    leaves = []
    flatten(client, leaves.append)
    leaves = [np.asarray(v, dtype).reshape(shape) for v, (dtype, shape) in zip(leaves, shapes)]
    data_bytes = sum(v.nbytes for v in leaves[:split])
    state_bytes = sum(v.nbytes for v in leaves[split:])
    if chunk and (data_size + data_bytes > bounds.data
                  or state_size + state_bytes > bounds.states):
      yield chunk
      chunk, data_size, state_size = [], 0, 0
    chunk.append(leaves)
    data_size += data_bytes
    state_size += state_bytes
  if chunk:
    yield chunk


# TensorFlow takes a NumPy array aligned to this many bytes as a tensor without
# copying it (EIGEN_MAX_ALIGN_BYTES); NumPy's large arrays are 16-byte aligned.
_TENSOR_ALIGNMENT = 64


def concatenate(chunk: list[list[np.ndarray]]) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
  """Per data leaf, the clients' values end to end, and where each starts.

  The concatenations are aligned so that TensorFlow reads them in place: a W2
  round's data (3 MB) is copied once, not twice, and SCAFFOLD's control
  variates (8 MB) once or, when they are rows of the buffer the last round
  stacked them in (see `_end_to_end`), not at all.
  """
  leaves = list(zip(*chunk))
  offsets = np.zeros((len(leaves), len(chunk) + 1), np.int32)
  for j, parts in enumerate(leaves):
    np.cumsum([len(p) for p in parts], out=offsets[j, 1:])
  return tuple(_end_to_end(parts, int(offsets[j, -1])) for j, parts in enumerate(leaves)), offsets


def _end_to_end(parts: tuple[np.ndarray, ...], rows: int) -> np.ndarray:
  """`parts` concatenated: a view when they already lie end to end, in order, in
  one aligned buffer, else an aligned copy.

  They do when a round's clients are the last round's chunk, in the same
  order, and their states are read back as the round returned them (rows of
  the states it stacked): full participation's case. A state is then not
  copied on its way back in.
  """
  first = parts[0]
  shape = (rows, *first.shape[1:])
  if first.base is not None and all(
      p.base is first.base and p.flags.c_contiguous and p.dtype == first.dtype
      and p.shape[1:] == first.shape[1:] for p in parts):
    address = start = first.ctypes.data
    for part in parts:
      if part.ctypes.data != address:
        break
      address += part.nbytes
    else:
      if start % _TENSOR_ALIGNMENT == 0:
        # C order's strides: a part of one row may carry any stride on its first axis.
        strides, step = [], first.itemsize
        for size in reversed(shape):
          strides.insert(0, step)
          step *= size
        return np.lib.stride_tricks.as_strided(first, shape, strides, writeable=False)
  return np.concatenate(parts, out=_aligned_empty(shape, first.dtype))


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
  """An uninitialized array whose data starts on a `_TENSOR_ALIGNMENT` boundary."""
  dtype = np.dtype(dtype)
  size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(size + _TENSOR_ALIGNMENT, np.uint8)
  start = -raw.ctypes.data % _TENSOR_ALIGNMENT
  return raw[start:start + size].view(dtype).reshape(shape)
