"""The trained model's weights as .npz (`final_model.npz`), written atomically."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Sequence

import numpy as np

from fedsim.errors import RunFailed


def export_model(path: pathlib.Path, weights: Any, names: Sequence[str] = ()) -> None:
  """Writes model weights to `path` as .npz, atomically.

  Trainable arrays are named by `names` (the model's `weight_names`, e.g.
  `dense/kernel`, in `keras_model.get_weights()` order), or `trainable_<i>`
  when `names` is empty; `model.initial_weights` reads the file back and
  `keras_model.set_weights([f[k] for k in f.files])` loads it into Keras.

  Raises:
    ValueError: if `names` is not empty and does not name every array.
    RunFailed: naming the path, if it cannot be written.
  """
  trainable = [np.asarray(w) for w in weights.trainable]
  names = list(names) or [f"trainable_{i}" for i in range(len(trainable))]
  if len(names) != len(trainable):
    raise ValueError(f"{len(names)} names for {len(trainable)} trainable arrays")
  arrays = dict(zip(names, trainable))
  arrays.update({f"non_trainable_{i}": np.asarray(w)
                 for i, w in enumerate(weights.non_trainable)})
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  try:
    with open(tmp, "wb") as f:
      np.savez(f, **arrays)
    os.replace(tmp, path)
  except OSError as e:
    tmp.unlink(missing_ok=True)
    raise RunFailed(f"cannot write {path}: {e.strerror or e}") from None
