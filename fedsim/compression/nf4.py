"""`encoder: nf4`: blockwise 4-bit NormalFloat (Dettmers et al. 2023, QLoRA).

Each block of `block_size` elements is scaled by its absolute maximum and
every element sent as the 4-bit index of the nearest of 16 quantiles of
N(0, 1) (see `fedsim.compression.stages.normal_float`). On the wire, per
tensor of n elements: the indices bit-packed as fedsim's other quantizers
pack them, 7 to an int32 (ceil(4 n / 28) int32), and ceil(n / block_size)
float32 absmax values. QLoRA's double quantization of the absmax values is not
implemented. TensorFlow is imported by the builder.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedsim.compression import ENCODERS
from fedsim.config.typed import bounded


@dataclasses.dataclass(frozen=True)
class NF4Params:
  """One float32 absmax per `block_size` elements (QLoRA uses 64)."""

  block_size: int = bounded(64, min=1)


@ENCODERS.register("nf4", params=NF4Params)
def _nf4(params: NF4Params) -> Any:
  """NF4 (QLoRA): absmax per block, nearest of 16 N(0, 1) quantiles, 4 bits each, packed."""
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.stages.normal_float import BITS, NormalFloatStage
  return te_api.chain(te_api.stages.FlattenEncodingStage(),
                      NormalFloatStage(params.block_size),
                      te_api.stages.BitpackingEncodingStage(BITS))
