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


WIRE_KEYS = ("packed_bits", "entropy_bits", "variable_bits", "coded_bits", "packed_symbols",
             "max_client_bits")


def measured_wire(metrics: Mapping[str, float], prefix: str) -> dict[str, float]:
  """The sums of every `prefix/.../wire/<key>` metric, by key (`WIRE_KEYS`, see
  `fedsim.compression.wire_meter`); 0 for a key none reports, but `coded_bits`
  is `packed_bits` when none reports it (rows logged before the lossless stage)."""
  out = dict.fromkeys(WIRE_KEYS, 0.0)
  seen = set()
  for name, value in metrics.items():
    parts = name.split("/")
    if parts[0] == prefix and len(parts) >= 3 and parts[-2] == "wire" and parts[-1] in out:
      out[parts[-1]] += float(value)
      seen.add(parts[-1])
  if "coded_bits" not in seen:
    out["coded_bits"] = out["packed_bits"]
  return out


def varying(rows: Sequence[Mapping[str, float]], prefix: str) -> bool:
  """True if any of a run's metrics rows measured value-dependent bits under `prefix`
  ('distributor' or 'aggregation'): tensors of value-dependent shape, or a lossless
  code. Its per-client size is then not fixed."""
  return any(m["variable_bits"] or m["coded_bits"] != m["packed_bits"]
             for m in (measured_wire(row, prefix) for row in rows))


@dataclasses.dataclass
class SizeInfo:
  """Per-round bit histories of a run, like TFF's old sizing executor.

  `broadcast_history[i]` / `aggregate_history[i]` are the total bits over all
  participating clients in the i-th round that ran; the `_entropy_` histories
  the same with bit-packed symbols entropy-coded (None: a round that sent
  bits but measured no symbols, see `round_metrics`).
  """

  per_client: ClientWireBits | None = None
  broadcast_history: list[int] = dataclasses.field(default_factory=list)
  aggregate_history: list[int] = dataclasses.field(default_factory=list)
  broadcast_entropy_history: list[int | None] = dataclasses.field(default_factory=list)
  aggregate_entropy_history: list[int | None] = dataclasses.field(default_factory=list)

  def restore_entropy(self, rows: Sequence[Mapping[str, float]]) -> None:
    """Takes the entropy histories from a resumed run's metrics rows (None for a
    row that did not measure them)."""
    self.broadcast_entropy_history = [r.get("broadcast_entropy_bits") for r in rows]
    self.aggregate_entropy_history = [r.get("aggregate_entropy_bits") for r in rows]

  @property
  def broadcast_bits(self) -> int:
    return sum(self.broadcast_history)

  @property
  def aggregate_bits(self) -> int:
    return sum(self.aggregate_history)

  def round_metrics(self, broadcast_clients: int, aggregated_clients: int,
                    late_uploads: int = 0,
                    measured: Mapping[str, float] | None = None,
                    upload_static: tuple[Sequence[int], Sequence[int]] | None = None
                    ) -> dict[str, float]:
    """Records one round and returns its metrics (bits) for the sinks.

    `late_uploads` clients sent their update too but were not aggregated
    (`system.late_uploads: sent`): their bits count in `aggregate_bits`, and
    alone in `late_upload_bits`. `measured` holds the round's stage metrics:
    their `distributor/.../wire/*` (one client's broadcast) and
    `aggregation/.../wire/*` (summed over the aggregated clients) replace the
    static size of packed symbols by what was sent for them (`coded_bits`:
    the packed words, or their Huffman code with `lossless: huffman`), add the
    value-dependent bits, and give the `*_entropy_bits` metrics. A late
    upload, which the server does not decode, is counted at the aggregated
    clients' mean.

    `*_entropy_bits` (and their cumulative sums) are left out of a round that
    sent bits that way without measuring any packed symbols (no encoder of
    that direction packs them: the estimate would only repeat the raw bits).
    `upload_static`: (aggregated, late) clients' static upload bits, one
    each, when they differ (encoder parameters set per client by a
    controller); `per_client.aggregate` for each otherwise, and the upload's
    `*_bits_per_client` is then their mean over the aggregated clients.
    `*_bits_per_client` are the static (fixed) part; `*_bits_per_client_mean`
    and `_max` what the round's clients were measured to receive or send (the
    broadcast is one value: both its size); the upload's are left out of a
    round that aggregated no client.
    """
    per = self.per_client
    down = measured_wire(measured or {}, "distributor")
    up = measured_wire(measured or {}, "aggregation")
    sent_up = aggregated_clients + late_uploads
    # Late uploads at the aggregated clients' mean of what was measured.
    scale = sent_up / aggregated_clients if aggregated_clients else 0.0
    down_bits = per.broadcast + down["variable_bits"] - down["packed_bits"] + down["coded_bits"]
    up_measured = up["variable_bits"] - up["packed_bits"] + up["coded_bits"]
    if upload_static is None:
      upload_static = ([per.aggregate] * aggregated_clients, [per.aggregate] * late_uploads)
    static_aggregated, static_late = upload_static
    per_aggregate = (sum(static_aggregated) / aggregated_clients if aggregated_clients
                     else per.aggregate)
    if per_aggregate == int(per_aggregate):
      per_aggregate = int(per_aggregate)
    broadcast = round(down_bits * broadcast_clients)
    aggregate = sum(static_aggregated) + sum(static_late) + round(up_measured * scale)
    late = sum(static_late) + round(
        up_measured / aggregated_clients * late_uploads if aggregated_clients else 0)
    broadcast_entropy = aggregate_entropy = None
    if down["packed_symbols"] or not broadcast:
      broadcast_entropy = round((down_bits - down["coded_bits"] + down["entropy_bits"])
                                * broadcast_clients)
    if up["packed_symbols"] or not aggregate:
      aggregate_entropy = aggregate - round((up["coded_bits"] - up["entropy_bits"]) * scale)
    self.broadcast_history.append(broadcast)
    self.aggregate_history.append(aggregate)
    self.broadcast_entropy_history.append(broadcast_entropy)
    self.aggregate_entropy_history.append(aggregate_entropy)
    out = {
        "broadcast_bits": broadcast,
        "aggregate_bits": aggregate,
        "late_upload_bits": late,
        CUMULATIVE_BROADCAST_BITS: self.broadcast_bits,
        CUMULATIVE_AGGREGATE_BITS: self.aggregate_bits,
    }
    for direction, value in (("broadcast", broadcast_entropy), ("aggregate", aggregate_entropy)):
      history = getattr(self, f"{direction}_entropy_history")
      if value is not None:
        out[f"{direction}_entropy_bits"] = value
      if None not in history:   # a total over rounds that all measured it
        out[f"cumulative_{direction}_entropy_bits"] = sum(history)
    out.update({
        "broadcast_bits_per_client": per.broadcast,
        "aggregate_bits_per_client": per_aggregate,
        "broadcast_bits_per_client_mean": down_bits,
        "broadcast_bits_per_client_max": down_bits,
    })
    if aggregated_clients:
      # Every client sends the same packed words; what it measured varies.
      fixed = per_aggregate - up["packed_bits"] / aggregated_clients
      out["aggregate_bits_per_client_mean"] = per_aggregate + up_measured / aggregated_clients
      out["aggregate_bits_per_client_max"] = fixed + up["max_client_bits"]
    out.update({
        "broadcast_model_bits_per_client": per.broadcast_model,
        "broadcast_other_bits_per_client": per.broadcast_other,
        # The client weight and metrics do not vary with an encoder's value, so
        # with per-client values the model's part is the mean less them.
        "aggregate_model_bits_per_client": per_aggregate - per.aggregate_other,
        "aggregate_other_bits_per_client": per.aggregate_other,
    })
    return out
