"""FetchSGD (Rothchild et al. 2020, "FetchSGD: communication-efficient federated
learning with sketching"), as the aggregation stage `count_sketch`.

Each client sends a count sketch S(u_i) of its whole update u (all float
tensors, concatenated: d coordinates): an r x c table with
S[j, h_j(t)] += s_j(t) u_t, h_j a bucket and s_j a sign per row j and
coordinate t, the same functions on every client and the server (drawn from
the run seed). A sketch is linear, so the sum below it (`sum`, or `secure`:
secure aggregation) and the algorithm's mean act on the sketches as on the
updates. The server keeps momentum and error in sketch space (Algorithm 1):

    S_u = rho S_u + S          S_e = S_e + S_u
    delta = top-k of U(S_e)    U(S)_t = median_j s_j(t) S[j, h_j(t)]
    S_e = 0 where S(delta) is nonzero

(the paper zeroes those entries instead of subtracting S(delta): "empirically,
doing so stabilizes the optimization"). delta, k coordinates of the update, is
the aggregate; the learning rate is the server optimizer's (FetchSGD's eta:
use server SGD without momentum, the momentum is here). It is listed first in
the chain, e.g. `aggregation: [{name: count_sketch, ...}, {name: secure, upper:
...}]`, so the mean sits between it and the sum. Each client sends r * c
float32 (32 r c bits, whatever d is).

This module registers the stage without TensorFlow; `fedsim.aggregation.sketching`
builds the TFF aggregation.
"""

from __future__ import annotations

import dataclasses

from fedsim.aggregation import StageContext, register_aggregation_stage
from fedsim.config.typed import bounded
from fedsim.errors import UserError


@dataclasses.dataclass(frozen=True)
class CountSketchParams:
  rows: int = bounded(5, min=1)          # r hash functions (the estimate is their median)
  columns: int = bounded(10000, min=1)   # c buckets per row
  k: int = bounded(1000, min=1)          # coordinates the server unsketches each round
  momentum: float = bounded(0.9, min=0, max=1)   # rho, in sketch space


def _check_first(params: CountSketchParams, context: StageContext, key: str) -> None:
  """FetchSGD's server keeps momentum and error of the clients' mean update: a mean
  above it would average its outputs instead. (A clip or zeroing above it would act
  on raw updates, which is sound, but the simple rule is the one checked.)"""
  del params
  if context.index != 0:
    raise UserError(f"{key} count_sketch: must be the first stage of the chain (clients"
                    " sketch their raw update; the mean and the sum below act on sketches)")


@register_aggregation_stage("count_sketch", CountSketchParams, role="wrap",
                            inner_key="sketch_sum", compresses=True, check_context=_check_first)
def build_count_sketch(params: CountSketchParams, inner, context: StageContext):
  """FetchSGD: clients send an r x c count sketch, the server unsketches the top-k (first stage)."""
  from fedsim.aggregation import sketching
  return sketching.FetchSGDFactory(inner, params.rows, params.columns, params.k,
                                   params.momentum, sketching.hash_seed(context.seed,
                                                                        context.index))
