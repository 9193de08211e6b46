"""Which clients take part in a round.

The sampler holds no mutable state: round r's cohort is a pure function of
(seed, r), so resuming from a checkpoint at round r needs only r.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedsim.seeds import SAMPLE_STREAM
from fedsim.errors import UserError


@dataclasses.dataclass(frozen=True)
class ClientSampler:
  """Uniform sampling of clients without replacement, independently each round."""

  client_ids: tuple[str, ...]
  seed: int

  def sample(self, round_num: int, count: int, *, key: str = "clients_per_round") -> list[str]:
    """The `count` distinct client ids of round `round_num`, in `client_ids` order.

    Raises:
      UserError: naming `key` when `count` is not in [1, number of clients].
      ValueError: when `round_num` is negative.
    """
    population = len(self.client_ids)
    if not 1 <= count <= population:
      raise UserError(f"{key}: {count} clients per round, but the dataset has"
                      f" {population} clients")
    if round_num < 0:
      raise ValueError(f"round_num must be >= 0, got {round_num}")
    rng = np.random.default_rng([self.seed, SAMPLE_STREAM, round_num])
    chosen = np.sort(rng.choice(population, count, replace=False))
    return [self.client_ids[i] for i in chosen]
