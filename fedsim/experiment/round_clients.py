"""One round's sampled clients as the runtimes read them: packed lazily, seeded alike anywhere."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from fedsim.data.packing import pack, packed_examples
from fedsim.seeds import PACK_STREAM

if TYPE_CHECKING:
  from fedsim.experiment.simulation import Simulation


def pack_client(sim: Simulation, round_num: int, client_id: str) -> dict[str, np.ndarray]:
  """`client_id`'s packed local-training input in round `round_num` ({x, y, mask}).

  Shuffled from stream [seed, PACK_STREAM, round, client index], so a client
  packs alike wherever (driver or worker) and whenever it is packed.
  """
  params = sim.config.data.params
  plan = sim.algorithm.client_plan
  batches = pack(sim.data.clients[client_id], params.batch_size, epochs=plan.epochs,
                 steps=plan.steps, shuffle=params.shuffle,
                 seed=[sim.config.seed, PACK_STREAM, round_num, sim.data.client_index[client_id]])
  return {"x": batches.x, "y": batches.y, "mask": batches.mask}


class RoundClients(Sequence):
  """One round's clients' local-training input, each client packed when it is read.

  `clients[i]` is `pack_client(sim, round_num, ids[i])`; nothing is kept, so a
  round of 10,000 clients never holds all their batches at once (the
  `inprocess` runtime reads them chunk by chunk). A runtime that packs
  clients where they train reads `ids` and `round_num` and calls
  `pack_client` there. Slicing gives a `RoundClients` of the same round.

  Attributes:
    round_num: the round, which seeds each client's shuffling.
    ids: the clients' ids, in order.
  """

  def __init__(self, sim: Simulation, round_num: int, ids):
    self.sim = sim
    self.round_num = round_num
    self.ids = tuple(ids)

  def __len__(self) -> int:
    return len(self.ids)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return RoundClients(self.sim, self.round_num, self.ids[i])
    return pack_client(self.sim, self.round_num, self.ids[i])

  def __iter__(self):
    return (pack_client(self.sim, self.round_num, cid) for cid in self.ids)

  def only(self, ids) -> RoundClients:
    """These clients (of this round, in the given order)."""
    return RoundClients(self.sim, self.round_num, ids)

  def num_examples(self) -> dict[str, float]:
    """Examples each client processes this round (a second epoch counts again), by id.

    Equals the `mask` sum of its packed batches, computed from its size and
    the client plan without packing (for the simulated clock).
    """
    params, plan = self.sim.config.data.params, self.sim.algorithm.client_plan
    return {cid: float(packed_examples(self.sim.data.client_size(cid), params.batch_size,
                                       epochs=plan.epochs, steps=plan.steps))
            for cid in self.ids}
