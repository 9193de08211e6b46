"""`encoder: threshold`: the bits it sends vary with the values, so the round measures them.

Threshold sparsification (see `fedsim.compression.stages.threshold`) sends the
m coordinates with |x_i| >= tau as m float values and m int32 indices; m
differs per client and round. Static sizing of the compiled round counts the
rest (`reports_own_bits`), and the server counts these as they arrive
(`fedsim.compression.wire_meter`). TensorFlow is imported by the builder.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedsim.compression import ENCODERS
from fedsim.config.typed import bounded


@dataclasses.dataclass(frozen=True)
class ThresholdParams:
  """Coordinates with |x_i| >= `tau` (an absolute magnitude) are sent."""

  tau: float = bounded(gt=0.0)


@ENCODERS.register("threshold", params=ThresholdParams, traits={"reports_own_bits": True})
def _threshold(params: ThresholdParams) -> Any:
  """Threshold sparsification: values with |x_i| >= tau and their int32 indices; bits vary."""
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.stages.threshold import ThresholdStage
  return te_api.chain(te_api.stages.FlattenEncodingStage(), ThresholdStage(params.tau))

