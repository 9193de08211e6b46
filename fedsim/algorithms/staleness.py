"""How much an asynchronous update counts, by its staleness s (server versions
between the client's download and its arrival), by name.

Each entry is `weight(params, s) -> w(s)`, written with arithmetic operators
only so that it applies to NumPy arrays and TensorFlow tensors alike (the
fedbuff process evaluates it in TensorFlow). FedBuff (Nguyen et al. 2022)
uses w(s) = 1/sqrt(1+s); polynomial weights (1+s)^-a are those of FedAsync
(Xie et al. 2019).
"""

from __future__ import annotations

import dataclasses

from fedsim.config.typed import bounded
from fedsim.registry import Registry

STALENESS = Registry("staleness weighting")


@dataclasses.dataclass(frozen=True)
class PolynomialParams:
  exponent: float = bounded(0.5, min=0)  # a in (1+s)^-a


@STALENESS.register("constant")
def constant(params, s):
  """w(s) = 1: stale updates count fully."""
  del params
  return 0.0 * s + 1.0


@STALENESS.register("sqrt")
def inverse_sqrt(params, s):
  """w(s) = 1/sqrt(1+s), FedBuff's choice."""
  del params
  return (1.0 + s) ** -0.5


@STALENESS.register("polynomial", params=PolynomialParams)
def polynomial(params: PolynomialParams, s):
  """w(s) = (1+s)^-a."""
  return (1.0 + s) ** -params.exponent
