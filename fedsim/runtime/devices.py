"""Where the compiled round runs: TensorFlow's device and CPU thread pools."""

from __future__ import annotations

import os
from typing import Any, Sequence

import tensorflow as tf

from fedsim.errors import UserError

DEVICES = ("auto", "cpu", "gpu")


def configure_threads(threads: str) -> bool:
  """Sets TensorFlow's CPU thread pools for `runtime.threads`, if TF has not started.

  'clients': each op on one thread, as many ops at once as there are cores:
  a batch's small ops do not scale across cores, but clients train side by
  side (W2 1.3-1.6x faster rounds on 2 cores; on CNNs neither layout won
  consistently: docs/explain/runtime.md, bench/cnn_rounds.py).
  'tensorflow' keeps TF's defaults.

  Returns:
    True when the pools were set; False when left alone, or when TensorFlow
    already runs in this process (its pools are fixed then, e.g. in tests).
  """
  if threads != "clients":
    return False
  try:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    # The CPUs this process may use: a study's `--jobs` pins each run to its share.
    tf.config.threading.set_inter_op_parallelism_threads(len(os.sched_getaffinity(0)) or 1)
  except RuntimeError:  # TF's context exists: its pools are made
    return False
  return True


def select_device(requested: str, gpus: Sequence[Any] | None = None) -> str:
  """The TensorFlow device name for `runtime.device`.

  Args:
    requested: 'auto' (a GPU when one is visible, else the CPU), 'cpu' or 'gpu'.
    gpus: the visible GPUs; None asks TensorFlow.

  Returns:
    '/GPU:0' or '/CPU:0'.

  Raises:
    UserError: an unknown name, or 'gpu' when TensorFlow sees no GPU.
  """
  if requested not in DEVICES:
    raise UserError(f"runtime.device: unknown device '{requested}'; choose one of:"
                    f" {', '.join(DEVICES)}")
  if requested == "cpu":
    return "/CPU:0"
  if gpus is None:
    gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    return "/GPU:0"
  if requested == "gpu":
    raise UserError("runtime.device: 'gpu' but TensorFlow sees no GPU (install the"
                    " 'gpu' extra on a CUDA machine, or use 'auto' or 'cpu')")
  return "/CPU:0"
