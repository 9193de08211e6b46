"""What a run hands to `on_round` callbacks besides the round's metrics."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class RoundInfo:
  """The global model and the clients of one finished round.

  Attributes:
    weights: the global model's trainable weights after the round, as NumPy
      arrays in the model's variable order (what `final_model.npz` holds).
    sampled: ids of the clients sampled this round (backups included); for
      an asynchronous algorithm (fedbuff), those dispatched during this
      server update.
    aggregated: ids of the clients whose updates the server aggregated (none
      for a skipped round), as `clients.csv` lists them.
    staleness: per entry of `aggregated`, server updates since that client
      downloaded the model (asynchronous algorithms); None for synchronous
      rounds.
  """

  weights: Sequence[np.ndarray]
  sampled: tuple[str, ...]
  aggregated: tuple[str, ...]
  staleness: tuple[int, ...] | None = None
