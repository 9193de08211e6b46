"""The privacy a DP run has spent, from Google's `dp_accounting`, for the way
the run samples its clients (`sampling:`) and the accountant its
`dp_gaussian` stage names (`accountant: rdp | pld`).

Each round that aggregates releases one Gaussian mechanism (noise stddev z C
on the sum of updates clipped to C) over a sample of the N clients:

  sampling: fixed    m = clients_per_round + backup_clients clients, uniformly
                     without replacement. Adjacency: replace one client (user-
                     level DP). Replacing one clipped update by another moves
                     the sum by up to 2C (u and -u), so the multiplier relative
                     to that sensitivity is z / 2; passing z, as TFF's add/remove
                     convention suggests, would understate epsilon (N = 100,
                     m = 10, z = 1.1, one round: 1.90, while one explicit pair
                     of neighbours already loses 5.57).
  sampling: poisson  each client independently with probability q. Adjacency:
                     add or remove one client (McMahan et al. 2018), which moves
                     the sum by up to C: multiplier z, dp_accounting's
                     `PoissonSampledDpEvent(q, GaussianDpEvent(z))`.

Accountants:
  rdp  Renyi DP (Mironov 2017) composed over rounds and converted to
       (epsilon, delta): Wang, Balle & Kasiviswanathan 2019 amplify a fixed
       sample, Mironov, Talwar & Zhang 2019 a Poisson one.
  pld  privacy loss distributions (Koskela et al. 2020; Doroshenko et al. 2022),
       composed by FFT: tight up to the discretization, which rounds up
       (pessimistic). dp_accounting's PLD has no sampling without replacement;
       a fixed sample is accounted as the pair P = (1 - q) N(0, s^2) +
       q N(2C, s^2), Q = N(0, s^2), q = m / N, s = z C, which dominates it: a
       round on neighbours D, D' (x replaced by x') is (1 - q) A + q B versus
       (1 - q) A + q B', A the law when x's slot is not drawn, B and B' when it
       is. By advanced joint convexity (Balle, Barthe & Gaboardi 2018, Thm 2)
       H_{1+q(g-1)}(M(D) || M(D')) <= q H_g(B || (1-b) A + b B') and, coupling
       the other m - 1 clients of B with the m of A, B' and A differ from B
       by a shift of norm <= 2C, so by joint convexity that is at most
       q H_g(N(2C, s^2) || N(0, s^2)) = H_{1+q(g-1)}(P || Q), for every g >= 1;
       the relation is symmetric, so this covers both orders. That pair is the
       Poisson-sampled Gaussian of multiplier z / 2, which dp_accounting
       accounts under add/remove (it also takes the reverse pair: a bound
       that can only be larger). The worst-case pair of
       tests/aggregation/test_dp_worst_case.py attains it.

With adaptive clipping (TFF's `gaussian_adaptive`) a round also releases the
noised count of clients below the clip (each adds +-0.5, stddev s); a client
moves the sum by C (2C replaced) and the count by 0.5 (1), so the round is one
Gaussian mechanism whose multiplier is (1 / z_v^2 + 1 / (2 s)^2)^(-1/2); TFF
splits the total z so that this is z, the same event as a fixed clip (the
worst-case test checks it against the query fedsim builds).

Assumptions: clients are sampled independently of their data (the device
model's choice of which sampled clients report does not look at the data),
each client's update is clipped to the clip norm, and rounds that were
skipped (fewer reports than system.min_clients, or, with poisson, nobody
sampled) released nothing. The number of clients a Poisson round aggregated
is not accounted: the mean divides by clients_per_round, not by it, as in
McMahan et al.'s DP-FedAvg.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from fedsim.backend.privacy import pld_of_accountant, rdp_curve

# How far one replaced client can move the clipped sum, in clip norms.
REPLACE_ONE_SENSITIVITY = 2.0
# The PLD's privacy-loss grid: the one-round PLD costs ~0.2 s at 1e-3 (~2 s at
# 1e-4, dp_accounting's default) and composing it ~0.05 s, so every round can
# log its epsilon; rounding up errs high by ~1e-3 (1.8289 vs 1.8282 at q = 0.01,
# z = 1, 1,000 rounds).
PLD_LOSS_STEP = 1e-3


@dataclasses.dataclass(frozen=True)
class PrivacyLedger:
  noise_multiplier: float  # noise stddev on the sum / clip norm (the config's)
  population: int          # N: clients that can be sampled
  sample_size: int         # m: clients sampled per round (fixed-size sampling)
  delta: float
  poisson_rate: float | None = None  # q with sampling: poisson; None: fixed-size samples
  accountant: str = "rdp"            # "rdp" or "pld"

  def epsilon(self, rounds: int) -> float:
    """Epsilon at `delta` after `rounds` released rounds (inf without noise)."""
    if rounds == 0:
      return 0.0
    if self.noise_multiplier == 0:
      return float("inf")
    if self.accountant == "pld":
      epsilon = self._one_round_pld().self_compose(rounds).get_epsilon_for_delta(self.delta)
      if math.isfinite(epsilon):
        return float(epsilon)
      # Beyond epsilon ~ 100 the PLD's truncated tail alone exceeds delta
      # (dp_accounting then says inf); RDP's bound still holds there.
    # RDP adds up over rounds: one round's curve, scaled, is the composition.
    orders, rdp = self._one_round_rdp()
    # Imported here: dp_accounting (with SciPy's stats) costs ~1 s that runs
    # without DP never need (fedsim.backend.lazy_imports).
    from dp_accounting import rdp as rdp_accounting
    epsilon, _ = rdp_accounting.compute_epsilon(orders, rdp * rounds, self.delta)
    return float(epsilon)

  def dp_event(self):
    """One round as dp_accounting's event, under `neighboring_relation()`."""
    import dp_accounting
    if self.poisson_rate is not None:
      return dp_accounting.PoissonSampledDpEvent(
          self.poisson_rate, dp_accounting.GaussianDpEvent(self.noise_multiplier))
    gaussian = dp_accounting.GaussianDpEvent(self.noise_multiplier / REPLACE_ONE_SENSITIVITY)
    if self.accountant == "pld":  # the dominating pair of the module docstring
      return dp_accounting.PoissonSampledDpEvent(self.sample_size / self.population, gaussian)
    return dp_accounting.SampledWithoutReplacementDpEvent(
        self.population, self.sample_size, gaussian)

  def neighboring_relation(self):
    import dp_accounting
    if self.poisson_rate is None and self.accountant == "rdp":
      return dp_accounting.NeighboringRelation.REPLACE_ONE
    return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE

  @functools.lru_cache(maxsize=None)
  def _one_round_rdp(self) -> tuple[np.ndarray, np.ndarray]:
    from dp_accounting import rdp as rdp_accounting
    accountant = rdp_accounting.RdpAccountant(neighboring_relation=self.neighboring_relation())
    accountant.compose(self.dp_event())
    return rdp_curve(accountant)

  @functools.lru_cache(maxsize=None)
  def _one_round_pld(self):
    import dp_accounting
    accountant = dp_accounting.pld.PLDAccountant(self.neighboring_relation(),
                                                 value_discretization_interval=PLD_LOSS_STEP)
    accountant.compose(self.dp_event())
    return pld_of_accountant(accountant)

  def round_metrics(self, rounds: int) -> dict[str, float]:
    return {"privacy/epsilon": self.epsilon(rounds), "privacy/delta": self.delta}
