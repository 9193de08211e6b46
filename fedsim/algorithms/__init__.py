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

# What `fedsim validate` knows of an algorithm before it is built (None: not
# declared, its build decides): whether each client's upload is its model delta
# alone, and whether its clients keep state between rounds; what the wrappers of
# its client work need (see fedsim.compression.check_upload_feedback).
ALGORITHMS = Registry("algorithm", traits={"model_delta_upload": None,
                                           "clients_keep_state": None})

__all__ = ["ALGORITHMS", "ClientPlan", "ClientRule", "FederatedAlgorithm", "Task"]


from fedsim.algorithms import easgd, fedavg, fedbuff, fedprox, fedsgd, scaffold  # noqa: E402,F401  (registers)
