"""The privacy a DP run has spent, from Google's `dp_accounting` (RDP accountant).

Each round that aggregates releases one Gaussian mechanism over a sample of m
of the N clients, drawn uniformly without replacement as fedsim's sampler
draws them (`clients_per_round + backup_clients` of the population). The
accountant composes those rounds with Renyi DP (Mironov 2017; Wang, Balle &
Kasiviswanathan 2019 for sampling without replacement) under replace-one
adjacency of clients (user-level DP), and converts to (epsilon, delta).

Sensitivity: dp_accounting's sampled-without-replacement Gaussian takes the
noise stddev relative to the L2 sensitivity under the relation it analyses,
replace-one. Replacing one client's update clipped to C by another moves the
clipped sum by up to 2C (u and -u), so a noise multiplier z (stddev z C) is
z / 2 relative to that sensitivity; passing z, as TFF's add/remove convention
suggests, would understate epsilon (N = 100, m = 10, z = 1.1, one round: 1.90,
while one explicit pair of neighbours already loses 5.57). With adaptive
clipping (TFF's `gaussian_adaptive`) a round releases the noised sum (stddev
z_v C) and the noised count of clients below the clip (each adds +-0.5, stddev
s); replacing a client moves them by 2C and 1, so the round is one Gaussian
mechanism whose multiplier is (4 / z_v^2 + 1 / s^2)^(-1/2) relative to that
shift; TFF splits the total z so that z^-2 = z_v^-2 + (2 s)^-2, which makes it
z / 2 as well (tests/aggregation/test_dp_worst_case.py checks both against
the exact loss of a worst-case pair).

Assumptions: clients are sampled independently of their data (the device
model's choice of which sampled clients report does not look at the data),
each client's update is clipped to the clip norm, and rounds that were
skipped released nothing.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from fedsim.backend.privacy import rdp_curve

# How far one replaced client can move the clipped sum, in clip norms.
REPLACE_ONE_SENSITIVITY = 2.0


@dataclasses.dataclass(frozen=True)
class PrivacyLedger:
  noise_multiplier: float  # noise stddev on the sum / clip norm (the config's)
  population: int          # N: clients that can be sampled
  sample_size: int         # m: clients sampled per round
  delta: float

  def epsilon(self, rounds: int) -> float:
    """Epsilon at `delta` after `rounds` released rounds (inf without noise)."""
    if rounds == 0:
      return 0.0
    if self.noise_multiplier == 0:
      return float("inf")
    # RDP adds up over rounds: one round's curve, scaled, is the composition.
    orders, rdp = self._one_round_rdp()
    # Imported here: dp_accounting (with SciPy's stats) costs ~1 s that runs
    # without DP never need (fedsim.backend.lazy_imports).
    from dp_accounting import rdp as rdp_accounting
    epsilon, _ = rdp_accounting.compute_epsilon(orders, rdp * rounds, self.delta)
    return float(epsilon)

  def dp_event(self):
    """One round as dp_accounting's event, its multiplier relative to the
    replace-one sensitivity (2 clip norms)."""
    import dp_accounting
    return dp_accounting.SampledWithoutReplacementDpEvent(
        self.population, self.sample_size,
        dp_accounting.GaussianDpEvent(self.noise_multiplier / REPLACE_ONE_SENSITIVITY))

  @functools.lru_cache(maxsize=None)
  def _one_round_rdp(self) -> tuple[np.ndarray, np.ndarray]:
    import dp_accounting
    from dp_accounting import rdp as rdp_accounting
    accountant = rdp_accounting.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(self.dp_event())
    return rdp_curve(accountant)

  def round_metrics(self, rounds: int) -> dict[str, float]:
    return {"privacy/epsilon": self.epsilon(rounds), "privacy/delta": self.delta}
