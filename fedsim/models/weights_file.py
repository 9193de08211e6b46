"""Model weights as .npz files: one array per Keras variable, in Keras order.

`final_model.npz` holds the trainable weights in the order of
`keras_model.get_weights()`, each named after its variable without the
":0" suffix (`dense/kernel:0` -> `dense/kernel`). `model.initial_weights`
reads such a file back; it matches arrays to weights by position and shape,
not by name, since Keras numbers layer names per process (`dense_3`).
"""

from __future__ import annotations

import os
import re
from typing import Sequence

import numpy as np

from fedsim.errors import UserError

_SUFFIX = re.compile(r":\d+$")


def npz_keys(variable_names: Sequence[str]) -> tuple[str, ...]:
  """Unique .npz keys for Keras variable names, in the same order.

  `dense/kernel:0` -> `dense/kernel`; a name taken twice (layers of two
  nested models may share a name) gets `_1`, `_2`, ... appended.
  """
  keys, seen = [], set()
  for name in variable_names:
    key = base = _SUFFIX.sub("", name)
    n = 0
    while key in seen:
      n += 1
      key = f"{base}_{n}"
    seen.add(key)
    keys.append(key)
  return tuple(keys)


def load_weights(path: str, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                 key: str = "model.initial_weights") -> list[np.ndarray]:
  """The arrays of .npz file `path` as float32, checked against the model.

  Args:
    path: the file (`~` expanded; relative to the working directory).
    names: the model's weight names (for messages), in order.
    shapes: the model's weight shapes, in the same order.
    key: the config key that named the file.

  Raises:
    UserError: one line naming `key` and the file: it is missing or
      unreadable, holds a different number of arrays, an array whose shape
      differs (named), or non-finite values.
  """
  where = f"{key}: {path}"
  try:
    with np.load(os.path.expanduser(path), allow_pickle=False) as f:
      arrays = [(name, f[name]) for name in f.files]
  except FileNotFoundError:
    raise UserError(f"{key}: no such file '{path}'") from None
  except (OSError, ValueError, EOFError) as e:
    raise UserError(f"{where}: not a readable .npz file ({e})") from None
  if len(arrays) != len(shapes):
    raise UserError(f"{where} holds {len(arrays)} array{'s' * (len(arrays) != 1)}; the"
                    f" model has {len(shapes)}"
                    f" weights ({', '.join(names)})")
  out = []
  for (array_name, array), name, shape in zip(arrays, names, shapes):
    if array.shape != tuple(shape):
      raise UserError(f"{where}: array '{array_name}' has shape {list(array.shape)}, but"
                      f" the model's weight '{name}' at that position has {list(shape)}")
    if not np.issubdtype(array.dtype, np.number) or not np.all(np.isfinite(array)):
      raise UserError(f"{where}: array '{array_name}' is not all finite numbers")
    out.append(array.astype(np.float32))
  return out
