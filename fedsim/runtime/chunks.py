"""A round's clients as the compiled client loop reads them: chunks of concatenated leaves.

Each client's data (and, when the clients keep state, its state) is flattened
into leaves; clients are grouped into chunks of at most `chunk_bytes`, and a
chunk's clients are laid end to end per leaf, with the offsets where each
starts, so one graph call runs the whole chunk and each iteration slices its
client back out.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from fedsim.backend import computations


def chunks(client_data: Sequence[Any], data_type, data_leaves,
           chunk_bytes: int) -> Iterator[list[list[np.ndarray]]]:
  """Lists of clients, each a list of its data leaves as arrays of the leaf types.

  Clients are read one at a time (a lazily packed round is never held at
  once). Scalar leaves become shape [1], so that every leaf concatenates on axis 0.
  """
  flatten = computations.flattener(data_type)
  shapes = [(np.dtype(t.dtype), (-1, *t.shape[1:]) if t.shape else (1,)) for t in data_leaves]
  chunk, size = [], 0
  for client in client_data:
    leaves = []
    flatten(client, leaves.append)
    leaves = [np.asarray(v, dtype).reshape(shape) for v, (dtype, shape) in zip(leaves, shapes)]
    nbytes = sum(v.nbytes for v in leaves)
    if chunk and size + nbytes > chunk_bytes:
      yield chunk
      chunk, size = [], 0
    chunk.append(leaves)
    size += nbytes
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
