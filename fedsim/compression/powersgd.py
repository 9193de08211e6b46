"""`encoder: powersgd`: rank-r PowerSGD (Vogels, Karimireddy & Jaggi 2019), per client.

Each encoded tensor of two or more dimensions, viewed as a matrix n x m, is
sent as two factors of `rank` columns, P^ (n x r, orthonormal) and
Q' (m x r): (n + m) r float32 values; the server decodes each client's
P^ Q'^T before summing. The paper all-reduces between its two products;
fedsim's round has one aggregation step, so each client runs the whole
power iteration on its own update (see `fedsim.compression.stages.low_rank`).
With `warm_start` (the paper's default) the factor Q each client starts
from is kept on the server, the clients' Q' summed after every round, and
sent down with the encoder parameters (m r float32 per tensor); without it,
each encoding draws a fresh Gaussian Q. Tensors of fewer than two dimensions
are sent unchanged. The paper pairs PowerSGD with error feedback:
`error_feedback: true` on the encode stage. TensorFlow is imported by the builder.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedsim.compression import ENCODERS
from fedsim.config.typed import bounded


@dataclasses.dataclass(frozen=True)
class PowerSgdParams:
  """`rank` columns per factor (capped at min(n, m), where the update is sent
  exactly); `warm_start`: start each round from the last round's Q."""

  rank: int = bounded(1, min=1)
  warm_start: bool = True


@ENCODERS.register("powersgd", params=PowerSgdParams)
def _powersgd(params: PowerSgdParams) -> Any:
  """PowerSGD (Vogels et al. 2019), per client: rank-r factors P^, Q', warm-started Q."""
  from fedsim.compression.encoders import encoded_spec
  from fedsim.compression.stages.low_rank import PowerSgdStage
  return PowerSgdStage(params.rank, params.warm_start, encoded_spec().shape.as_list())
