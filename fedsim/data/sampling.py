"""Which clients take part in a round.

The sampler holds no mutable state: round r's cohort is a pure function of
(seed, r), so resuming from a checkpoint at round r needs only r.

Two schemes (`sampling:` in the config), each the one its privacy accounting
assumes (fedsim/aggregation/accounting.py):
  fixed    m = clients_per_round (+ backup_clients) distinct clients, uniformly
           without replacement (replace-one adjacency);
  poisson  each client independently with probability q, so a round has
           Binomial(N, q) clients, possibly none (add/remove adjacency; McMahan
           et al. 2018's DP-FedAvg).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedsim.seeds import POISSON_STREAM, SAMPLE_STREAM
from fedsim.errors import UserError


@dataclasses.dataclass(frozen=True)
class ClientSampler:
  """Uniform sampling of clients, independently each round: `count` without
  replacement, or each client with probability `poisson_rate` when it is set."""

  client_ids: tuple[str, ...]
  seed: int
  poisson_rate: float | None = None  # q of `sampling: poisson`; None: fixed-size samples

  def sample(self, round_num: int, count: int, *, key: str = "clients_per_round") -> list[str]:
    """The distinct client ids of round `round_num`, in `client_ids` order:
    `count` of them, or with `poisson_rate` each client with that probability
    (`count` is then only checked).

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
    if self.poisson_rate is not None:
      # One uniform per client in client order: whether client i is in the
      # round does not depend on the other clients' draws or on the count.
      rng = np.random.default_rng([self.seed, POISSON_STREAM, round_num])
      chosen = np.flatnonzero(rng.random(population) < self.poisson_rate)
    elif count == population:
      # What the draw below gives; seeding a generator is ~0.1 ms of a W2 round's loop.
      return list(self.client_ids)
    else:
      rng = np.random.default_rng([self.seed, SAMPLE_STREAM, round_num])
      chosen = np.sort(rng.choice(population, count, replace=False))
    return [self.client_ids[i] for i in chosen]
