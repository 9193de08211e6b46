"""The privacy `ddp` spends: Kairouz, Liu & Steinke 2021's accounting of the
distributed discrete Gaussian, amplified by fedsim's sampling.

One round releases the sum of n clients' rounded records and n discrete
Gaussians N_Z(0, sigma^2) (sigma, the bounds and the dimension d are those of
TFF's factory, `fedsim.backend.distributed_dp.ddp_bounds`). For a shift of the
sum with L2 norm D2 and L1 norm D1, Proposition 14 of arXiv:2102.06387 bounds
its Renyi DP at order a by
    min(a/2 s2^2 + tau d,  a/2 (s2^2 + 2 s1 tau + tau^2 d),  a/2 (s2 + sqrt(d) tau)^2),
    s2 = D2 / (sqrt(n) sigma), s1 = D1 / (sqrt(n) sigma),
    tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)).
Adjacency is replace-one, as for `dp_gaussian` (accounting.py): replacing one
client's record (L2 <= B2, L1 <= B1 after rounding) moves the sum by up to
D2 = 2 B2, D1 = 2 B1. A round samples m of N clients without replacement;
Wang, Balle & Kasiviswanathan 2019 (Theorem 9) amplify any RDP curve for that
sampling at integer orders; rounds compose by adding RDP, converted to
(epsilon, delta) by dp_accounting (the conversion `accounting.py` uses).
TFF ships no accountant for its factory (its docstring leaves it to the
user); this is the one Kairouz et al. use in their experiments.

Assumptions: each aggregated round sums the noise of `clients` clients (fewer
clients, e.g. dropouts, would add less noise: `aggregation/ddp/.../
actual_num_clients` shows how many did), and which sampled clients report does
not depend on their data.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from scipy.special import gammaln, logsumexp

ORDERS = tuple(range(2, 257))      # WBK's bound holds at integer orders
REPLACE_ONE_SENSITIVITY = 2.0      # replacing one client moves the sum by twice its bound


@dataclasses.dataclass(frozen=True)
class DdpLedger:
  l2_bound: float       # B2: one client's rounded record's L2 norm bound (scaled domain)
  l1_bound: float       # B1: its L1 norm bound
  local_stddev: float   # sigma: each client's discrete Gaussian (scaled domain)
  dim: int              # d: coordinates of the sum
  clients: int          # n: clients whose noise a round's sum carries
  population: int       # N
  sample_size: int      # m
  delta: float

  @classmethod
  def for_stage(cls, params, clients_per_round: int, population: int, sample_size: int,
                update_elements: int) -> "DdpLedger":
    """The ledger of a `ddp` stage (DdpParams) on updates of `update_elements` floats."""
    from fedsim.backend.distributed_dp import ddp_bounds
    bounds = ddp_bounds(params.noise_multiplier, clients_per_round, params.bits, params.clip,
                        update_elements, params.rotation, 0.0, params.modclip_prob)
    return cls(bounds.l2_bound, bounds.l1_bound, bounds.local_stddev, bounds.padded_dim,
               clients_per_round, population, sample_size, params.delta)

  def unsampled_rdp(self, order: int) -> float:
    """Proposition 14's RDP of one round at `order`, all clients in the sum."""
    scale = math.sqrt(self.clients) * self.local_stddev
    s2 = REPLACE_ONE_SENSITIVITY * self.l2_bound / scale
    s1 = REPLACE_ONE_SENSITIVITY * self.l1_bound / scale
    k = np.arange(1, self.clients)
    tau = 10 * float(np.sum(np.exp(-2 * math.pi ** 2 * self.local_stddev ** 2 * k / (k + 1))))
    d = self.dim
    return min(order / 2 * s2 ** 2 + tau * d,
               order / 2 * (s2 ** 2 + 2 * s1 * tau + tau ** 2 * d),
               order / 2 * (s2 + math.sqrt(d) * tau) ** 2)

  def sampled_rdp(self, order: int) -> float:
    """One round's RDP with m of N clients sampled without replacement (WBK Theorem 9)."""
    q = self.sample_size / self.population
    unsampled = self.unsampled_rdp(order)
    if q >= 1:
      return unsampled
    eps2 = self.unsampled_rdp(2)
    log_comb = lambda j: gammaln(order + 1) - gammaln(j + 1) - gammaln(order - j + 1)
    terms = [0.0, 2 * math.log(q) + log_comb(2) + min(
        math.log(4) + eps2 + math.log(-math.expm1(-eps2)), eps2 + math.log(2))]
    terms += [j * math.log(q) + log_comb(j) + math.log(2) + (j - 1) * self.unsampled_rdp(j)
              for j in range(3, order + 1)]
    return min(unsampled, float(logsumexp(terms)) / (order - 1))

  @functools.lru_cache(maxsize=None)
  def _one_round(self) -> np.ndarray:
    return np.array([self.sampled_rdp(a) for a in ORDERS])

  def epsilon(self, rounds: int) -> float:
    """Epsilon at `delta` after `rounds` released rounds (inf without noise)."""
    if rounds == 0:
      return 0.0
    if self.local_stddev == 0:
      return float("inf")
    from dp_accounting import rdp as rdp_accounting
    epsilon, _ = rdp_accounting.compute_epsilon(np.array(ORDERS, float),
                                                self._one_round() * rounds, self.delta)
    return float(epsilon)

  def round_metrics(self, rounds: int) -> dict[str, float]:
    return {"privacy/epsilon": self.epsilon(rounds), "privacy/delta": self.delta}
