"""`encoder: float16` and `encoder: bfloat16`: every encoded element as a 16-bit float.

The casts half precision federated simulators ship (FLSim, pfl-research): each
float32 tensor the direction encodes is cast (round to nearest, ties to even)
and cast back on arrival, 16 bits per element on the wire and nothing else
(see `fedsim.compression.stages.cast`). TensorFlow is imported by the builders.
"""

from __future__ import annotations

from typing import Any

from fedsim.compression import ENCODERS
from fedsim.registry import NoParams


@ENCODERS.register("float16")
def _float16(params: NoParams) -> Any:
  """IEEE half precision (10 mantissa bits; overflows to inf above 65,504), 16 bits each."""
  del params
  import tensorflow as tf
  from fedsim.compression.stages.cast import CastStage
  return CastStage(tf.float16)


@ENCODERS.register("bfloat16")
def _bfloat16(params: NoParams) -> Any:
  """bfloat16 (float32's range, 7 mantissa bits), 16 bits each."""
  del params
  import tensorflow as tf
  from fedsim.compression.stages.cast import CastStage
  return CastStage(tf.bfloat16)
