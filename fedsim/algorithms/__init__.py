"""Federated algorithms by name.

Each entry is a thin `build(params, task) -> FederatedAlgorithm` that
validates its parameters and composes stages (see `fedsim.learning`). Its
module docstring names the paper it follows and its update rule. A params
class may define `aggregation_kind()` ('weighted_mean', 'mean' or 'sum': how
the algorithm combines client updates), so that `fedsim validate` can refuse
an aggregation chain the algorithm cannot use.
"""

from __future__ import annotations

from fedsim.registry import Registry
from fedsim.task import ClientPlan, ClientRule, FederatedAlgorithm, Task

ALGORITHMS = Registry("algorithm")

__all__ = ["ALGORITHMS", "ClientPlan", "ClientRule", "FederatedAlgorithm", "Task"]


from fedsim.algorithms import easgd, fedavg, fedbuff, fedprox, fedsgd, scaffold  # noqa: E402,F401  (registers)
