"""signSGD with majority vote (Bernstein et al. 2018, "signSGD: compressed
optimisation for non-convex problems"; 2019, "signSGD with majority vote is
communication efficient and fault tolerant"), as the aggregation stage
`majority_vote`:

    update = step * sign(sum_i sign(u_i))        (a tie, sum 0, gives 0)

Each client sends one bit per coordinate of its update u_i (1 for u_i >= 0,
0 for u_i < 0: a zero coordinate votes +1), packed 32 to an int32 word, so a
tensor of n coordinates costs 32 * ceil(n / 32) bits and nothing else (no
scale). One client, one vote: the algorithm must not weight clients by
their examples (`client_weighting: uniform`; `fedsim validate` says so). The server's
optimizer then applies `update` as it would the mean (with server SGD, its
learning rate is the paper's step size).

This module registers the stage without TensorFlow (`fedsim validate` stays
fast); `fedsim.aggregation.vote` builds the TFF aggregation.
"""

from __future__ import annotations

import dataclasses

from fedsim.aggregation import (COMPLETE, WEIGHTED_MEAN, StageContext,
                                register_aggregation_stage)
from fedsim.config.typed import bounded
from fedsim.errors import UserError


@dataclasses.dataclass(frozen=True)
class MajorityVoteParams:
  step: float = bounded(1.0, gt=0)   # the vote's sign is multiplied by this


def _check_unweighted(params: MajorityVoteParams, context: StageContext, key: str) -> None:
  del params
  if context.kind == WEIGHTED_MEAN:
    raise UserError(f"{key} majority_vote: gives each client one vote, but the algorithm"
                    " weights clients by their examples; set algorithm.client_weighting:"
                    " uniform")


@register_aggregation_stage("majority_vote", MajorityVoteParams, role=COMPLETE, compresses=True,
                            check_context=_check_unweighted)
def build_majority_vote(params: MajorityVoteParams, context: StageContext):
  """signSGD with majority vote: 1 bit per coordinate up, step * sign(sum of signs) (last stage)."""
  del context
  from fedsim.aggregation import vote
  return vote.SignVoteFactory(params.step)
