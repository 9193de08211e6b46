"""The epsilons `ddp` and `local_dp` log, against computations made here.

ddp: the logged epsilon is at least the exact privacy loss of one explicit
pair of neighbouring populations. In the scaled integer domain, every client
sends a rounded record -k e_1 and in the neighbour one client sends +k e_1
instead (2k <= 2 B2, the replace-one shift the ledger must cover); only the
first coordinate differs, where the server sees the sum of n discrete
Gaussians N_Z(0, sigma^2) plus the records. Its law P is computed exactly here
(the discrete Gaussian's mass normalised over +-40 sigma, convolved n times);
sampling m of N gives Q = (1 - q) P + q P(. - 2k). Privacy losses are binned
downwards and composed over rounds by `test_dp_worst_case`'s convolution, so
the epsilon found is a lower bound on the mechanism's (no dp_accounting, no
Kairouz et al. bound involved).

local_dp: a client's T rounds are T Gaussian mechanisms of sensitivity 2C and
stddev z C; their composition is one Gaussian mechanism with
mu = 2 sqrt(T) / z, whose exact epsilon is the analytic Gaussian mechanism's
(Balle & Wang 2018, Theorem 8): the epsilon solving
Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) = delta.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, signal
from scipy.special import ndtr

from tests.aggregation.test_dp_worst_case import DELTA, LOSS_STEP, _epsilon_of_composed


def _sum_of_discrete_gaussians(sigma: float, n: int) -> tuple[np.ndarray, np.ndarray]:
  """(support, pmf) of the sum of n independent N_Z(0, sigma^2)."""
  half = int(math.ceil(40 * sigma)) + 2
  x = np.arange(-half, half + 1)
  one = np.exp(-x.astype(float) ** 2 / (2 * sigma * sigma))
  one /= one.sum()
  pmf = one
  for _ in range(n - 1):
    pmf = signal.fftconvolve(pmf, one).clip(min=0)
  return np.arange(len(pmf)) - (len(pmf) // 2), pmf / pmf.sum()


def ddg_pair_epsilon(population, sample_size, clients, sigma, shift, rounds) -> float:
  """Lower bound on epsilon at DELTA of the pair above (both directions);
  `shift` is the integer move 2k of the sum."""
  _, p = _sum_of_discrete_gaussians(sigma, clients)
  q = sample_size / population
  p_shifted = np.concatenate([np.zeros(shift), p[:-shift]])
  # Cells where FFT round-off could be most of the mass are left out: that
  # only drops mass, which lowers delta (the bound stays a lower bound).
  floor = 1e-12 * p.max()
  keep = (p > floor) & (p_shifted > floor)
  p, p_shifted = p[keep], p_shifted[keep]
  mix = (1 - q) * p + q * p_shifted
  loss_q = np.log(mix) - np.log(p)           # log dQ/dP, under Q
  return max(_epsilon_of_composed(np.floor(loss_q / LOSS_STEP).astype(np.int64), mix, rounds),
             _epsilon_of_composed(np.floor(-loss_q / LOSS_STEP).astype(np.int64), p, rounds))


def _ddp_ledger(population, sample_size, clients, sigma, l2_bound, dim, scale=1.0):
  from fedsim.aggregation.ddp_accounting import DdpLedger
  l1_bound = math.ceil(l2_bound * min(math.sqrt(dim), l2_bound))
  return DdpLedger(l2_bound * scale, l1_bound * scale, sigma, dim, clients, population,
                   sample_size, DELTA)


DDP_CASES = [  # (N, m, n, sigma, B2, d, rounds)
    (40, 10, 10, 164.757, 590.367, 4810, 1),   # dp_compression's ddp at 12 bits, z = 1
    (40, 10, 10, 164.757, 590.367, 4810, 10),
    (100, 10, 5, 0.8, 3.0, 50, 5),             # small sigma: the discreteness (tau) counts
    (1000, 50, 50, 6.0, 40.0, 1000, 20),
]


@pytest.mark.parametrize("population,sample_size,clients,sigma,l2_bound,dim,rounds", DDP_CASES)
def test_ddp_epsilon_is_at_least_the_worst_case_pair(population, sample_size, clients, sigma,
                                                     l2_bound, dim, rounds):
  ledger = _ddp_ledger(population, sample_size, clients, sigma, l2_bound, dim)
  exact = ddg_pair_epsilon(population, sample_size, clients, sigma,
                           int(math.floor(2 * l2_bound)), rounds)
  assert ledger.round_metrics(rounds)["privacy/epsilon"] >= exact > 0


def test_the_ddp_pair_catches_half_the_sensitivity():
  """The test above can fail: a ledger told one record's bound (add/remove's
  sensitivity) instead of twice it logs less than the pair loses."""
  below = [case for case in DDP_CASES[:2]
           if _ddp_ledger(*case[:6], scale=0.5).epsilon(case[6])
           < ddg_pair_epsilon(*case[:4], int(math.floor(2 * case[4])), case[6])]
  assert below == DDP_CASES[:2]


def test_ddp_bounds_are_tffs_for_the_ledger():
  """The ledger's B2 and sigma at 12 bits, z = 1 on the 4,810-weight MLP are the
  factory's `scaled_inflated_l2` and `scaled_local_stddev` that a run logged
  (590.3670654296875 and 164.75709533691406, float32)."""
  from fedsim.aggregation.ddp import DdpParams
  from fedsim.aggregation.ddp_accounting import DdpLedger
  ledger = DdpLedger.for_stage(DdpParams(noise_multiplier=1.0, clip=1.0, bits=12), 10, 40, 10,
                               4810)
  assert ledger.l2_bound == pytest.approx(590.3670654296875, rel=1e-6)
  assert ledger.local_stddev == pytest.approx(164.75709533691406, rel=1e-6)
  assert ledger.dim == 4810


def analytic_gaussian_epsilon(mu: float, delta: float) -> float:
  """Balle & Wang 2018: the least epsilon of a Gaussian mechanism with
  sensitivity / stddev = mu at `delta`."""
  def excess(eps):
    return ndtr(mu / 2 - eps / mu) - math.exp(eps) * ndtr(-mu / 2 - eps / mu) - delta
  return optimize.brentq(excess, 0.0, 500.0, xtol=1e-12)


@pytest.mark.parametrize("noise_multiplier,rounds", [(1.0, 1), (1.0, 50), (4.0, 100), (0.5, 3)])
def test_local_epsilon_is_the_analytic_gaussian_mechanisms(noise_multiplier, rounds):
  from fedsim.aggregation.local_dp import LocalDpLedger
  logged = LocalDpLedger(noise_multiplier, DELTA).round_metrics(rounds)["privacy/local_epsilon"]
  exact = analytic_gaussian_epsilon(2 * math.sqrt(rounds) / noise_multiplier, DELTA)
  # PLD rounds the loss up (pessimistic): never below (but for the root
  # finder's 1e-12), and within 1%.
  assert exact * (1 - 1e-9) <= logged <= exact * 1.01 + 1e-3


def test_local_epsilon_uses_the_sensitivity_2c():
  """With sensitivity C (z relative to it) the logged epsilon would be half or less."""
  from fedsim.aggregation.local_dp import LocalDpLedger
  logged = LocalDpLedger(2.0, DELTA).epsilon(10)
  assert analytic_gaussian_epsilon(math.sqrt(10) / 2.0, DELTA) < 0.6 * logged


def test_chains_keep_one_ledger_per_private_stage():
  from fedsim.aggregation import PrivacyScope, parse_aggregation, privacy_ledgers
  scope = PrivacyScope(population=40, sample_size=10, clients_per_round=10,
                       update_elements=4810)
  assert privacy_ledgers(parse_aggregation([{"name": "clip", "norm": 1.0}]), scope) is None
  chain = parse_aggregation([{"name": "local_dp", "noise_multiplier": 2.0, "clip": 1.0},
                             {"name": "clip", "norm": 1.0},
                             {"name": "dp_gaussian", "noise_multiplier": 1.0}])
  metrics = privacy_ledgers(chain, scope).round_metrics(3)
  from fedsim.aggregation.accounting import PrivacyLedger
  assert metrics == {**PrivacyLedger(1.0, 40, 10, 1e-5).round_metrics(3),
                     "privacy/local_epsilon": metrics["privacy/local_epsilon"],
                     "privacy/local_delta": 1e-5}
  assert metrics["privacy/local_epsilon"] == pytest.approx(
      analytic_gaussian_epsilon(2 * math.sqrt(3) / 2.0, DELTA), rel=0.01)
