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
  round's data (3 MB) and SCAFFOLD's control variates (8 MB) are copied once,
  not twice.
  """
  leaves = list(zip(*chunk))
  offsets = np.zeros((len(leaves), len(chunk) + 1), np.int32)
  for j, parts in enumerate(leaves):
    np.cumsum([len(p) for p in parts], out=offsets[j, 1:])
  return tuple(np.concatenate(parts, out=_aligned_empty(
      (int(offsets[j, -1]), *parts[0].shape[1:]), parts[0].dtype))
               for j, parts in enumerate(leaves)), offsets


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
  """An uninitialized array whose data starts on a `_TENSOR_ALIGNMENT` boundary."""
  dtype = np.dtype(dtype)
  size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(size + _TENSOR_ALIGNMENT, np.uint8)
  start = -raw.ctypes.data % _TENSOR_ALIGNMENT
  return raw[start:start + size].view(dtype).reshape(shape)
