"""Distributed DP over secure aggregation: the distributed discrete Gaussian
mechanism (Kairouz, Liu & Steinke 2021, "The Distributed Discrete Gaussian
Mechanism for Federated Learning with Secure Aggregation", Algorithms 1-2),
as TFF 0.87's `DistributedDpSumFactory` builds it.

Each client clips its update to L2 norm C, rotates it (randomized Hadamard or
Fourier transform), scales it by 1/gamma and rounds it randomly to integers,
adds discrete Gaussian noise of stddev z C / (gamma sqrt(n)) and reduces it
modulo 2^bits; secure aggregation sums the clients' integers modulo 2^bits,
and the server unscales, unrotates and divides by the count:
    mean = R^T (gamma sum_i [round(R clip(u_i, C) / gamma) + N_Z(0, sigma^2)] mod 2^b) / n.
No one but the sum sees a client's value, and the sum carries the noise of n
clients: the central noise z C of DP-FedAvg, at `bits` bits per coordinate.

`noise_multiplier` is TFF's: the central stddev over the clip, before the
rounding inflates the sensitivity. The epsilon logged is Kairouz et al.'s own
accounting (`ddp_accounting.py`). The noise and rounding are TFF's unseeded
draws: two runs of one config differ, unlike `dp_gaussian`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Literal

from fedsim.aggregation import (COMPLETE, WEIGHTED_MEAN, StageContext,
                                register_aggregation_stage)
from fedsim.config.typed import bounded
from fedsim.errors import UserError


@dataclasses.dataclass(frozen=True)
class DdpParams:
  noise_multiplier: float = bounded(min=0)   # central noise stddev / clip, split over clients
  clip: float = bounded(gt=0)                # L2 clip of each client's update
  bits: int = bounded(16, min=1, max=22)     # secure sum modulo 2^bits (TFF allows 1-22)
  rotation: Literal["dft", "hd"] = "dft"     # discrete Fourier (pads to even) or Hadamard (2^k)
  modclip_prob: float = bounded(1e-4, gt=0)  # aimed-at chance that the sum wraps around
  delta: float = bounded(1e-5, gt=0, max=1)  # the delta epsilon is reported at

  def check(self, key: str) -> None:
    if self.modclip_prob >= 1:
      raise UserError(f"{key}.modclip_prob: must be below 1, got {self.modclip_prob}")


def _check_ddp(params: DdpParams, context: StageContext, key: str) -> None:
  """TFF's own checks, in one line naming the key: the modulus must hold the
  sum of clients_per_round values to `modclip_prob`."""
  if context.kind == WEIGHTED_MEAN:
    raise UserError(f"{key} ddp: differentially private aggregation is unweighted; set"
                    " algorithm.client_weighting: uniform")
  if context.sampling == "poisson":
    # Each client adds 1/n of the noise for n = clients_per_round: a smaller
    # Poisson round carries less noise than its accounting (and TFF's) assumes.
    raise UserError(f"{key} ddp: its noise is split over exactly clients_per_round clients;"
                    " it needs sampling: fixed")
  n = context.clients_per_round
  if not n:
    return
  # TFF's number of stddevs: sqrt(2) erfcinv(p), the two-sided normal quantile.
  k = statistics.NormalDist().inv_cdf(1 - params.modclip_prob / 2)
  if params.bits < math.log2(n) or 2 ** (2 * params.bits) < n * k * k:
    least = max(math.ceil(math.log2(n)), math.ceil(math.log2(n * k * k) / 2))
    raise UserError(f"{key}.bits: {params.bits} bits cannot hold the sum of {n} clients"
                    f" (modclip_prob {params.modclip_prob:g}); use at least {least}")


def _ddp_ledger(params: DdpParams, scope):
  from fedsim.aggregation.ddp_accounting import DdpLedger
  return DdpLedger.for_stage(params, scope.clients_per_round, scope.population,
                             scope.sample_size, scope.update_elements)


# compresses: integers of `bits` bits per coordinate cross the wire, not floats.
@register_aggregation_stage("ddp", DdpParams, role=COMPLETE, compresses=True,
                            check_context=_check_ddp, privacy_ledger=_ddp_ledger)
def build_ddp(params: DdpParams, context: StageContext):
  """Distributed discrete Gaussian over a secure sum modulo 2^bits, then the mean (last stage).

  TFF's DistributedDpSumFactory, the count securely summed, as
  `tff.learning.ddp_secure_aggregator` composes them (fixed clip, no zeroing).
  """
  import tensorflow_federated as tff
  from fedsim.backend.distributed_dp import distributed_dp_sum_factory
  ddp_sum = distributed_dp_sum_factory(
      noise_multiplier=float(params.noise_multiplier),
      expected_clients_per_round=int(context.clients_per_round), bits=int(params.bits),
      l2_clip=float(params.clip), modclip_prob=float(params.modclip_prob),
      mechanism="distributed_dgauss", rotation_type=params.rotation)
  return tff.aggregators.UnweightedMeanFactory(
      ddp_sum, count_sum_factory=tff.aggregators.SecureSumFactory(1, 0))
