"""TFF 0.87's distributed DP over secure aggregation, which `tff.aggregators`
does not export (`tensorflow_federated/python/aggregators/distributed_dp.py`,
the factory behind `tff.learning.ddp_secure_aggregator`): an upgrade that
moves or changes it touches this module only.

Each import runs inside its function: the DP packages load at first use
(`lazy_imports`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


def allow_deep_computations() -> None:
  """Lets protobuf (upb) nest messages deeper than 100 levels.

  The distributed DP factory nests eight aggregators; a learning process
  around it builds a computation proto deeper than upb's default limit, and
  TFF fails with 'DecodeError: Error parsing message' (its own
  `build_unweighted_fed_avg(model_aggregator=ddp_secure_aggregator(...))` does
  too). upb raises the limit when oversize protos are allowed.
  """
  try:
    from google._upb import _message  # pylint: disable=import-outside-toplevel
  except ImportError:   # the C++ or pure-Python protobuf: no such limit to raise
    return
  _message.SetAllowOversizeProtos(True)


def distributed_dp_sum_factory(**kwargs) -> Any:
  """TFF's `DistributedDpSumFactory(**kwargs)` (an unweighted sum)."""
  from tensorflow_federated.python.aggregators import distributed_dp
  allow_deep_computations()
  return distributed_dp.DistributedDpSumFactory(**kwargs)


@dataclasses.dataclass(frozen=True)
class DdpBounds:
  """What TFF's factory hands its DP query, in the scaled integer domain."""

  scale: float            # 1 / gamma: a value x is sent as round(x * scale)
  l2_bound: float         # one client's L2 norm bound after rounding (inflated)
  l1_bound: float         # its L1 norm bound
  local_stddev: float     # each client's discrete Gaussian / Skellam stddev
  padded_dim: int         # coordinates after the rotation's padding


def ddp_bounds(noise_multiplier: float, clients_per_round: int, bits: int, l2_clip: float,
               dim: int, rotation: str, beta: float, modclip_prob: float) -> DdpBounds:
  """The bounds `DistributedDpSumFactory.create` derives for a `dim`-element
  value (fixed clip), computed with TFF's own helpers, as it computes them.

  Raises:
    ValueError: the parameters TFF's factory refuses (it checks them first).
  """
  from tensorflow_federated.python.aggregators import discretization, distributed_dp
  padded = (2 ** math.ceil(math.log2(max(1, dim))) if rotation == "hd"
            else math.ceil(max(1, dim) / 2) * 2)
  local = noise_multiplier * l2_clip / math.sqrt(clients_per_round)
  k_stddevs = distributed_dp._clip_prob_to_num_stddevs(modclip_prob)  # pylint: disable=protected-access
  scale = float(distributed_dp._heuristic_scale_factor(  # pylint: disable=protected-access
      local, l2_clip, bits, clients_per_round, padded, k_stddevs).numpy())
  scale = min(scale, distributed_dp.MAX_SCALE_FACTOR)
  inflated = float(discretization.inflated_l2_norm_bound(
      l2_norm_bound=l2_clip, gamma=1.0 / scale, beta=beta, dim=padded).numpy())
  # TFF's leeway for float32 rounding, and L1 <= min(sqrt(d), L2) * L2 for integers.
  l2_bound = (inflated + 1e-5) * scale
  l1_bound = math.ceil(l2_bound * min(math.sqrt(padded), l2_bound))
  return DdpBounds(scale=scale, l2_bound=l2_bound, l1_bound=float(l1_bound),
                   local_stddev=local * scale, padded_dim=padded)
