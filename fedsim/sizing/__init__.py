"""What crosses the wire, in bits, read from the computation TFF runs.

TFF's sizing executor was removed in 0.48, so fedsim compiles the round to
its MapReduceForm (see `mapreduce_form.py`): `prepare` produces what the
server broadcasts to each client, `work` what each client hands to the
aggregation. Sizes are sums over tensors of elements x dtype bits of those
values, in the representation that crosses (after encoding and bit packing).

Two things the compiled types cannot show are measured inside the round
(`fedsim.compression.wire_meter`) and reported by the encode stages as
measurements ending in `wire/<key>`: what an entropy coder would send for the
bit-packed symbols, and the actual size of tensors whose shape depends on the
values (threshold sparsification). `SizeInfo.round_metrics` folds them in.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from fedsim.metric_names import CUMULATIVE_AGGREGATE_BITS, CUMULATIVE_BROADCAST_BITS


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


def measured_wire(metrics: Mapping[str, float], prefix: str) -> dict[str, float]:
  """The sums of every `prefix/.../wire/<key>` metric, by key ('packed_bits',
  'entropy_bits', 'variable_bits'); 0 for a key none reports."""
  out = {"packed_bits": 0.0, "entropy_bits": 0.0, "variable_bits": 0.0}
  for name, value in metrics.items():
    parts = name.split("/")
    if parts[0] == prefix and len(parts) >= 3 and parts[-2] == "wire" and parts[-1] in out:
      out[parts[-1]] += float(value)
  return out


def varying(rows: Sequence[Mapping[str, float]], prefix: str) -> bool:
  """True if any of a run's metrics rows measured value-dependent bits under `prefix`
  ('distributor' or 'aggregation'): its per-client size is then not fixed."""
  return any(measured_wire(row, prefix)["variable_bits"] for row in rows)


@dataclasses.dataclass
class SizeInfo:
  """Per-round bit histories of a run, like TFF's old sizing executor.

  `broadcast_history[i]` / `aggregate_history[i]` are the total bits over all
  participating clients in the i-th round that ran; the `_entropy_` histories
  the same with bit-packed symbols entropy-coded.
  """

  per_client: ClientWireBits | None = None
  broadcast_history: list[int] = dataclasses.field(default_factory=list)
  aggregate_history: list[int] = dataclasses.field(default_factory=list)
  broadcast_entropy_history: list[int] = dataclasses.field(default_factory=list)
  aggregate_entropy_history: list[int] = dataclasses.field(default_factory=list)

  def restore_entropy(self, rows: Sequence[Mapping[str, float]]) -> None:
    """Takes the entropy histories from a resumed run's metrics rows (a row
    written before they existed counts its raw bits)."""
    self.broadcast_entropy_history = [
        int(r.get("broadcast_entropy_bits", r.get("broadcast_bits", 0))) for r in rows]
    self.aggregate_entropy_history = [
        int(r.get("aggregate_entropy_bits", r.get("aggregate_bits", 0))) for r in rows]

  @property
  def broadcast_bits(self) -> int:
    return sum(self.broadcast_history)

  @property
  def aggregate_bits(self) -> int:
    return sum(self.aggregate_history)

  def round_metrics(self, broadcast_clients: int, aggregated_clients: int,
                    late_uploads: int = 0,
                    measured: Mapping[str, float] | None = None) -> dict[str, float]:
    """Records one round and returns its metrics (bits) for the sinks.

    `late_uploads` clients sent their update too but were not aggregated
    (`system.late_uploads: sent`): their bits count in `aggregate_bits`, and
    alone in `late_upload_bits`. `measured` holds the round's stage metrics:
    their `distributor/.../wire/*` (one client's broadcast) and
    `aggregation/.../wire/*` (summed over the aggregated clients) add the
    value-dependent bits to the static per-client sizes and give the
    `*_entropy_bits` metrics. A late upload, which the server does not
    decode, is counted at the aggregated clients' mean.
    """
    per = self.per_client
    down = measured_wire(measured or {}, "distributor")
    up = measured_wire(measured or {}, "aggregation")
    sent_up = aggregated_clients + late_uploads
    # Late uploads at the aggregated clients' mean of what was measured.
    scale = sent_up / aggregated_clients if aggregated_clients else 0.0
    down_bits = per.broadcast + down["variable_bits"]
    broadcast = round(down_bits * broadcast_clients)
    aggregate = per.aggregate * sent_up + round(up["variable_bits"] * scale)
    late = per.aggregate * late_uploads + round(
        up["variable_bits"] / aggregated_clients * late_uploads if aggregated_clients else 0)
    broadcast_entropy = round(
        (down_bits - down["packed_bits"] + down["entropy_bits"]) * broadcast_clients)
    aggregate_entropy = aggregate - round((up["packed_bits"] - up["entropy_bits"]) * scale)
    self.broadcast_history.append(broadcast)
    self.aggregate_history.append(aggregate)
    self.broadcast_entropy_history.append(broadcast_entropy)
    self.aggregate_entropy_history.append(aggregate_entropy)
    return {
        "broadcast_bits": broadcast,
        "aggregate_bits": aggregate,
        "late_upload_bits": late,
        "broadcast_entropy_bits": broadcast_entropy,
        "aggregate_entropy_bits": aggregate_entropy,
        CUMULATIVE_BROADCAST_BITS: self.broadcast_bits,
        CUMULATIVE_AGGREGATE_BITS: self.aggregate_bits,
        "cumulative_broadcast_entropy_bits": sum(self.broadcast_entropy_history),
        "cumulative_aggregate_entropy_bits": sum(self.aggregate_entropy_history),
        "broadcast_bits_per_client": per.broadcast,
        "aggregate_bits_per_client": per.aggregate,
        "broadcast_model_bits_per_client": per.broadcast_model,
        "broadcast_other_bits_per_client": per.broadcast_other,
        "aggregate_model_bits_per_client": per.aggregate_model,
        "aggregate_other_bits_per_client": per.aggregate_other,
    }
