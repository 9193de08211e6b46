"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith 2020, "Federated
Optimization in Heterogeneous Networks").

FedAvg whose clients minimize a proximal local objective around the global
model w^t they received,
    h_i(w) = F_i(w) + mu/2 ||w - w^t||^2,
so every local gradient step uses grad F_i(w) + mu (w - w^t); the server then
averages as FedAvg does (weighted by examples, as TFF's
`build_weighted_fed_prox`, or uniformly). mu = 0 is FedAvg exactly.

Deliberately not TFF's rule: TFF 0.87's `build_weighted_fed_prox`
(`learning/templates/proximal_client_work.py`) adds mu (w^t - w) to the
gradient, the opposite sign, contrary to its own docstring; it equals the
paper's rule run with -mu, which pushes clients away from w^t. Keep the
paper's sign here even "to match TFF": tests/learning/test_fedprox.py pins
the update to a NumPy transcription of the paper's local step.
"""

from __future__ import annotations

import dataclasses

from fedsim.algorithms import ALGORITHMS, FederatedAlgorithm, Task
from fedsim.algorithms.fedavg import FedAvgParams, build_model_averaging
from fedsim.config.typed import bounded


@dataclasses.dataclass(frozen=True)
class FedProxParams(FedAvgParams):
  mu: float = bounded(0.01, min=0)   # proximal strength (TFF: proximal_strength)


@ALGORITHMS.register("fedprox", params=FedProxParams,
                     traits={"model_delta_upload": True, "clients_keep_state": True})
def build_fedprox(params: FedProxParams, task: Task) -> FederatedAlgorithm:
  """FedAvg with the proximal term mu/2 ||w - w_global||^2 in the local objective."""
  mu = params.mu

  # grad of mu/2 ||w - w^t||^2 is +mu (w - w^t): the paper's sign, not TFF 0.87's.
  def proximal_gradient(received):
    return lambda weights: tuple(mu * (w - r) for w, r in zip(weights, received))

  return build_model_averaging(params, task, extra_gradient=proximal_gradient)
