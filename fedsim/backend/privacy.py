"""The internals of TFF's, tensorflow_privacy's and dp_accounting's DP code that
fedsim reads: an upgrade of those packages touches this module.

Each import runs inside its function: the DP packages load at first use
(`lazy_imports`), and runs without DP never pay for them.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def adaptive_clip_noise_params(noise_multiplier: float, clients_per_round: float,
                               clipped_count_stddev: float | None) -> tuple[float, float]:
  """TFF's split of a total noise multiplier between the values and the clipped
  count of adaptive clipping: (value noise multiplier, clipped-count stddev)."""
  from tensorflow_federated.python.aggregators import differential_privacy
  return differential_privacy.adaptive_clip_noise_params(
      noise_multiplier, clients_per_round, clipped_count_stddev)


def adaptive_clip_gaussians(query: Any) -> tuple[Any, Any]:
  """The two `GaussianSumQuery` objects inside a `QuantileAdaptiveClipSumQuery`:
  the one that noises the clipped sum, and the one that noises the count of
  clients below the clip.

  Raises:
    TypeError: tensorflow_privacy built the query from other parts.
  """
  import tensorflow_privacy as tfp
  below = query._quantile_estimator_query._below_estimate_query._numerator  # pylint: disable=protected-access
  found = (query._sum_query, below)  # pylint: disable=protected-access
  for inner in found:
    if type(inner) is not tfp.GaussianSumQuery:
      raise TypeError(f"unexpected tensorflow_privacy internals: {type(inner).__name__}")
  return found


def rdp_curve(accountant: Any) -> tuple[np.ndarray, np.ndarray]:
  """(orders, RDP at each order) that a dp_accounting `RdpAccountant` has composed."""
  return (np.asarray(accountant._orders, float),  # pylint: disable=protected-access
          np.asarray(accountant._rdp, float))  # pylint: disable=protected-access


def pld_of_accountant(accountant: Any) -> Any:
  """The `PrivacyLossDistribution` a dp_accounting `PLDAccountant` has composed."""
  return accountant._pld  # pylint: disable=protected-access
