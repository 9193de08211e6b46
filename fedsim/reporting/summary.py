"""The end-of-run summary `fedsim run` prints: where the run is, how it ended,
and the bits it sent each way, in all and per round. Imports no TensorFlow."""

from __future__ import annotations

from fedsim.metric_names import CLIENTS_AGGREGATED, EVAL_ACCURACY
from fedsim.reporting.compare_table import EPSILON
from fedsim.reporting.units import format_bits
from fedsim.sizing import varying


DELTA = "privacy/delta"  # logged beside EPSILON by the DP accountants


def run_summary(result, variant: str | None = None) -> str:
  """What `fedsim run` prints after a run: its directory, rounds, final accuracy,
  the bits sent each way (in all, and per round), and with DP the epsilon spent."""
  final = result.final
  sizes = result.size_info
  ref_b, ref_a = result.uncompressed_bits_per_client
  wire = sizes.per_client
  label = f"[{variant}] " if variant else ""
  acc = final.get(EVAL_ACCURACY)
  down = (controlled_broadcast(ref_b, result.metrics)
          if result.controlled_direction == "broadcast"
          else vs_uncompressed(ref_b, wire.broadcast, varying(result.metrics, "distributor"),
                               counter_bits=wire.broadcast_other))
  up = (controlled_upload(ref_a, result.metrics) if result.controlled_direction == "aggregation"
        else vs_uncompressed(ref_a, wire.aggregate, varying(result.metrics, "aggregation")))
  lines = [
      f"{label}run dir: {result.run_dir}",
      f"{label}rounds: {len(result.metrics)}"
      + (f", final eval/accuracy {acc:.4f}" if acc is not None else ""),
      f"{label}communicated: broadcast {format_bits(sizes.broadcast_bits)}"
      f" ({down}),"
      f" aggregate {format_bits(sizes.aggregate_bits)} ({up})",
  ]
  if sizes.broadcast_history:
    lines.append(f"{label}{per_round(result)}")
  if final.get(EPSILON) is not None:  # differentially private: the guarantee spent
    delta = final.get(DELTA)
    lines.append(f"{label}privacy: epsilon {final[EPSILON]:.4g}"
                 + (f" at delta {delta:.3g}" if delta is not None else "")
                 + f" after {len(result.metrics)} rounds")
  return "\n".join(lines)


def per_round(result) -> str:
  """'per round: broadcast X (model Y), aggregate ...': each direction's mean
  bits over all clients of a round (as TFF's compression tutorial prints them),
  and of those the model's: the share of the model in a client's compiled
  size, exact unless the size varies with the values."""
  sizes, wire = result.size_info, result.size_info.per_client
  up_total, up_model = wire.aggregate, wire.aggregate_model
  if result.controlled_direction == "aggregation":  # each client's own: the aggregated uploads
    up_total = _over_uploads(result.metrics, "aggregate_bits_per_client")
    up_model = _over_uploads(result.metrics, "aggregate_model_bits_per_client")
  parts = []
  for direction, history, total, model, prefix in (
      ("broadcast", sizes.broadcast_history, wire.broadcast, wire.broadcast_model, "distributor"),
      ("aggregate", sizes.aggregate_history, up_total, up_model, "aggregation")):
    mean = sum(history) / len(history)
    share = ("model varies with the values" if varying(result.metrics, prefix)
             else f"model {format_bits(mean * model / total) if total else '0 bit'}")
    parts.append(f"{direction} {format_bits(mean)} ({share})")
  rounds = len(sizes.broadcast_history)
  return f"per round: {', '.join(parts)}; mean of {rounds} round{'s' if rounds != 1 else ''}"


def _over_uploads(rows, key: str) -> float:
  """A per-client metric summed over every aggregated upload of the run."""
  return sum(row[key] * row[CLIENTS_AGGREGATED] for row in rows if row.get(CLIENTS_AGGREGATED))


def controlled_upload(reference_bits: int, rows) -> str:
  """A controller sets the upload size: the ratio of the mean over every
  aggregated upload of the run (one client's static size would only describe
  that client). Said to be set per client if some round's `control/*_min`
  and `control/*_max` differ, else each round."""
  clients = sum(row.get(CLIENTS_AGGREGATED, 0) for row in rows)
  bits = _over_uploads(rows, "aggregate_bits_per_client_mean")
  per_client = any(row[key] != row.get(key[:-len("_min")] + "_max", row[key])
                   for row in rows for key in row
                   if key.startswith("control/") and key.endswith("_min"))
  setter = f"set {'per client' if per_client else 'each round'} by a controller"
  if not clients or not bits:
    return setter
  return f"{setter}: {vs_uncompressed(reference_bits, round(bits / clients))} on average"


def controlled_broadcast(reference_bits: int, rows) -> str:
  """A controller sets the broadcast's size, the same for every client of a
  round: the ratio of the mean over every client the run broadcast to."""
  sent = [(row["broadcast_bits"], row["broadcast_bits_per_client"]) for row in rows
          if row.get("broadcast_bits_per_client")]
  clients = sum(total / per_client for total, per_client in sent)
  setter = "set each round by a controller"
  if not clients:
    return setter
  mean = round(sum(total for total, _ in sent) / clients)
  return f"{setter}: {vs_uncompressed(reference_bits, mean)} on average"


def vs_uncompressed(reference_bits: int, bits: int, measured: bool = False,
                    counter_bits: int = 0) -> str:
  """How a per-client size compares with the same algorithm uncompressed
  (`measured`: the size varied with the values, so there is no one ratio;
  `counter_bits`: encoders' round counters in `bits`, which the uncompressed
  run has none of)."""
  if measured:
    return "sizes vary with the values, measured each round"
  if reference_bits == bits:
    return "uncompressed"
  if counter_bits and reference_bits == bits - counter_bits:
    # An uncompressed broadcast that carries the upload encoder's counter.
    return f"uncompressed + {counter_bits} bits of round counter"
  if f"{reference_bits / bits:.2f}" == "1.00":   # a ratio would read "1.00x"
    return f"uncompressed {bits - reference_bits:+d} bits"
  if bits > reference_bits:
    return f"{bits / reference_bits:.2f}x more bits than uncompressed"
  return f"{reference_bits / bits:.2f}x fewer bits than uncompressed"
