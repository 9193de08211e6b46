"""The privacy a DP run has spent, from Google's `dp_accounting` (RDP accountant).

Each round that aggregates releases one Gaussian mechanism with noise
multiplier z (noise stddev on the sum / clip norm) over a sample of m of the
N clients, drawn uniformly without replacement as fedsim's sampler draws them
(`clients_per_round + backup_clients` of the population). The accountant
composes those rounds with Renyi DP (Mironov 2017; Wang, Balle &
Kasiviswanathan 2019 for sampling without replacement) under replace-one
adjacency of clients (user-level DP), and converts to (epsilon, delta).
Assumptions: clients are sampled independently of their data (the device
model's choice of which sampled clients report does not look at the data),
each client's update is clipped to the clip norm, and rounds that were
skipped released nothing.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np


@dataclasses.dataclass(frozen=True)
class PrivacyLedger:
  noise_multiplier: float
  population: int        # N: clients that can be sampled
  sample_size: int       # m: clients sampled per round
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
    from dp_accounting.rdp import rdp_privacy_accountant
    epsilon, _ = rdp_privacy_accountant.compute_epsilon(orders, rdp * rounds, self.delta)
    return float(epsilon)

  @functools.lru_cache(maxsize=None)
  def _one_round_rdp(self) -> tuple[np.ndarray, np.ndarray]:
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(
        self.population, self.sample_size,
        dp_accounting.GaussianDpEvent(self.noise_multiplier)))
    orders = np.asarray(accountant._orders, float)  # pylint: disable=protected-access
    return orders, np.asarray(accountant._rdp, float)  # pylint: disable=protected-access

  def round_metrics(self, rounds: int) -> dict[str, float]:
    return {"privacy/epsilon": self.epsilon(rounds), "privacy/delta": self.delta}
