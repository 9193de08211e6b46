"""Local differential privacy: each client clips its own update and adds
Gaussian noise before anything leaves it (the Gaussian mechanism run by the
client; e.g. Truex et al. 2020, "LDP-Fed"), for comparison with central
(`dp_gaussian`) and distributed (`ddp`) DP.

Per client per round, with clip C and noise multiplier z:
    upload = clip(u, C) + N(0, (z C)^2 I),    clip(u, C) = u * min(1, C / ||u||_2).

Adjacency: the client's update is the whole dataset of this mechanism, so
neighbours are any two updates of norm <= C; they differ by up to 2C in L2,
so one round is a Gaussian mechanism with noise z / 2 relative to its
sensitivity. The per-client epsilon composes that mechanism over the rounds
the client took part in, at worst every round that aggregated (the one the
ledger logs, `privacy/local_epsilon`); composed, T rounds are one Gaussian
mechanism of noise z / (2 sqrt(T)), which dp_accounting's PLD accountant
converts to (epsilon, delta) (Balle & Wang 2018 give it in closed form; the
test computes it that way).

Noise is `tf.random.stateless_normal`, seeded by (run seed, stage index,
round, a fingerprint of the client's clipped update): runs repeat bit for bit
and clients, whose updates differ, draw unrelated noise. A deployment would
draw it from the device's secure generator instead.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedsim.aggregation import (WEIGHTED_MEAN, WRAP, StageContext,
                                register_aggregation_stage)
from fedsim.config.typed import bounded
from fedsim.errors import UserError

# Any two updates of norm <= C are neighbours: they differ by up to 2C.
LOCAL_SENSITIVITY = 2.0


@dataclasses.dataclass(frozen=True)
class LocalDpParams:
  noise_multiplier: float = bounded(min=0)   # each client's noise stddev / clip
  clip: float = bounded(gt=0)                # L2 clip of each client's update
  delta: float = bounded(1e-5, gt=0, max=1)  # the delta the per-client epsilon is at


@dataclasses.dataclass(frozen=True)
class LocalDpLedger:
  noise_multiplier: float
  delta: float

  def epsilon(self, rounds: int) -> float:
    """One client's epsilon at `delta` after taking part in `rounds` rounds."""
    if rounds == 0:
      return 0.0
    if self.noise_multiplier == 0:
      return float("inf")
    import dp_accounting
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(self.noise_multiplier / LOCAL_SENSITIVITY), rounds)
    # The composed loss is N(mu^2 / 2, mu^2), mu = 2 sqrt(rounds) / z: a grid of
    # 1e-5 of its mean (at least 1e-4) keeps the PLD ~1e5 points at any epsilon
    # (1e-4 took ~30 s a round at epsilon 1,000) and errs up by at most one step.
    mu_squared = rounds * (LOCAL_SENSITIVITY / self.noise_multiplier) ** 2
    accountant = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.REPLACE_ONE,
        value_discretization_interval=max(1e-4, 1e-5 * mu_squared / 2))
    return float(accountant.compose(event).get_epsilon(self.delta))

  def round_metrics(self, rounds: int) -> dict[str, float]:
    return {"privacy/local_epsilon": self.epsilon(rounds), "privacy/local_delta": self.delta}


def _check_local_dp(params: LocalDpParams, context: StageContext, key: str) -> None:
  if context.kind == WEIGHTED_MEAN:
    raise UserError(f"{key} local_dp: differentially private aggregation is unweighted (a"
                    " weighted mean would send each client's example count in the clear);"
                    " set algorithm.client_weighting: uniform")


def _local_dp_ledger(params: LocalDpParams, scope) -> LocalDpLedger:
  del scope  # each client's guarantee: its own rounds, whoever else takes part
  return LocalDpLedger(params.noise_multiplier, params.delta)


@register_aggregation_stage("local_dp", LocalDpParams, role=WRAP, inner_key="noised",
                            check_context=_check_local_dp, privacy_ledger=_local_dp_ledger)
def build_local_dp(params: LocalDpParams, inner, context: StageContext):
  """Local DP: each client clips its update to `clip` and adds N(0, (z clip)^2) itself.

  `inner` (the mean and what follows) receives the noised updates.
  """
  from fedsim.aggregation.local_noise import LocalGaussianFactory
  salt = np.random.SeedSequence([context.seed % 2**64, context.index]).generate_state(
      2, np.uint32).view(np.int32)
  return LocalGaussianFactory(inner, params.clip, params.clip * params.noise_multiplier,
                              tuple(int(s) for s in salt))
