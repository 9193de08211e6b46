"""What crosses the wire, in bits, read from the computation TFF runs.

TFF's sizing executor was removed in 0.48, so fedsim compiles the round to
its MapReduceForm (see `mapreduce_form.py`): `prepare` produces what the
server broadcasts to each client, `work` what each client hands to the
aggregation. Sizes are sums over tensors of elements x dtype bits of those
values, in the representation that crosses (after encoding and bit packing).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ClientWireBits:
  """Bits one participating client receives and sends in one round."""

  broadcast: int         # server -> client, all of it
  broadcast_model: int   # ... of which the model (encoded, if compressed)
  aggregate: int         # client -> server, all of it
  aggregate_model: int   # ... of which the model update (encoded, if compressed)

  @property
  def broadcast_other(self) -> int:
    return self.broadcast - self.broadcast_model

  @property
  def aggregate_other(self) -> int:
    """Client weight and training metrics."""
    return self.aggregate - self.aggregate_model


@dataclasses.dataclass
class SizeInfo:
  """Per-round bit histories of a run, like TFF's old sizing executor.

  `broadcast_history[i]` / `aggregate_history[i]` are the total bits over all
  participating clients in the i-th round that ran.
  """

  per_client: ClientWireBits | None = None
  broadcast_history: list[int] = dataclasses.field(default_factory=list)
  aggregate_history: list[int] = dataclasses.field(default_factory=list)

  @property
  def broadcast_bits(self) -> int:
    return sum(self.broadcast_history)

  @property
  def aggregate_bits(self) -> int:
    return sum(self.aggregate_history)

  def round_metrics(self, broadcast_clients: int, aggregated_clients: int,
                    late_uploads: int = 0) -> dict[str, float]:
    """Records one round and returns its metrics (bits) for the sinks.

    `late_uploads` clients sent their update too but were not aggregated
    (`system.late_uploads: sent`): their bits count in `aggregate_bits`, and
    alone in `late_upload_bits`.
    """
    per = self.per_client
    broadcast = per.broadcast * broadcast_clients
    aggregate = per.aggregate * (aggregated_clients + late_uploads)
    self.broadcast_history.append(broadcast)
    self.aggregate_history.append(aggregate)
    return {
        "broadcast_bits": broadcast,
        "aggregate_bits": aggregate,
        "late_upload_bits": per.aggregate * late_uploads,
        "cumulative_broadcast_bits": self.broadcast_bits,
        "cumulative_aggregate_bits": self.aggregate_bits,
        "broadcast_bits_per_client": per.broadcast,
        "aggregate_bits_per_client": per.aggregate,
        "broadcast_model_bits_per_client": per.broadcast_model,
        "broadcast_other_bits_per_client": per.broadcast_other,
        "aggregate_model_bits_per_client": per.aggregate_model,
        "aggregate_other_bits_per_client": per.aggregate_other,
    }
