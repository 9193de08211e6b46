"""What one played round hands the run loop: the new server state, the round's
metrics and which clients took part.

Both schedules return it, and build its metrics with `round_metrics`: the
synchronous round (`loop._play_round`) and the buffered server update of
asynchronous algorithms (`async_loop.BufferedRounds`), so the loop's callbacks
log, checkpoint and report every algorithm the same way, and `clients.csv`
has one row per round for each.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from fedsim.aggregation import measurements as stage_measurements
from fedsim.errors import RunFailed
from fedsim.metric_names import ROUND, ROUND_SECONDS, TRAIN_LOSS
from fedsim.sizing import SizeInfo


@dataclasses.dataclass(frozen=True)
class RoundResult:
  """One round (synchronous) or one server update (buffered) as played.

  Attributes:
    state: the server state after the round.
    metrics: the round's metrics, as metrics.csv logs them (evaluation is
      added by the loop).
    simulated_seconds: simulated seconds since the run began, at the round's end.
    sampled: ids of the clients sampled this round (backups included), or,
      for a buffered algorithm, dispatched (downloaded the model) during this
      server update; in sampling / dispatch order.
    aggregated: ids of the clients whose updates the server applied this
      round (none for a skipped round), in the order it took them: sampled
      order, or arrival order for a buffered algorithm (where one client may
      appear twice if it arrived twice).
    staleness: per entry of `aggregated`, server updates between the model
      the client downloaded and the one its update was applied to; None for
      synchronous rounds, where every update is computed on the current model.
  """

  state: Any
  metrics: dict[str, float]
  simulated_seconds: float
  sampled: tuple[str, ...]
  aggregated: tuple[str, ...]
  staleness: tuple[int, ...] | None = None
  # A controller's state after deciding this round (None without one).
  control_state: dict | None = None
  # With a controller: (each aggregated client's value, its upload's static bits).
  client_values: tuple[tuple[float, ...], tuple[int, ...]] | None = None

  def clients_row(self) -> dict[str, str]:
    """The round's `clients.csv` cells: ids (and staleness) separated by spaces,
    staleness empty for a synchronous round; with a controller, each aggregated
    client's `value` and `upload_bits` too, in `aggregated` order."""
    row = {"sampled": " ".join(self.sampled),
           "aggregated": " ".join(self.aggregated),
           "staleness": "" if self.staleness is None else " ".join(map(str, self.staleness))}
    if self.client_values is not None:
      values, bits = self.client_values
      row["value"] = " ".join(map(repr, values))
      row["upload_bits"] = " ".join(map(str, bits))
    return row


def round_metrics(round_num: int, measurements: Mapping[str, Any] | None, aggregation_plan,
                  clients: Mapping[str, float], *, seconds: float, sizes: SizeInfo,
                  downloads: int, uploads: int, late_uploads: int,
                  client_states: Mapping[str, float] | None = None,
                  upload_static=None) -> dict[str, float]:
  """One round's metrics, in metrics.csv's column order, for either schedule.

  Args:
    measurements: the process's measurements, None for a skipped round.
    clients: the schedule's client counts and simulated clock.
    seconds: wall-clock seconds the runtime took for the round.
    sizes: records the round's bits (`downloads` clients received the model,
      `uploads` were aggregated, `late_uploads` sent theirs too late).
    client_states: error feedback's residual ages (`feedback.residual_ages`), if any.
    upload_static: (aggregated, late) uploads' static bits, one per client,
      when clients' encoders differ (a controller); else `sizes.per_client`'s.

  Raises:
    RunFailed: the round's training diverged.
  """
  metrics: dict[str, float] = {ROUND: round_num}
  if measurements is not None:
    metrics.update(client_states or {})
    metrics.update(process_metrics(measurements, aggregation_plan))
    check_converging(round_num, metrics)
  metrics.update(clients)
  metrics[ROUND_SECONDS] = seconds
  metrics.update(sizes.round_metrics(downloads, uploads, late_uploads=late_uploads,
                                     measured=metrics, upload_static=upload_static))
  return metrics


def process_metrics(measurements: Mapping[str, Any], aggregation_plan) -> dict[str, float]:
  """Every stage's measurements as named metrics: the clients' summed training
  statistics as `train/*`, the rest under their stage (`aggregation/clip/...`)."""
  work = measurements["client_work"]
  out = {
      TRAIN_LOSS: float(work["loss"]),
      "train/accuracy": float(work["accuracy"]),
      "train/num_examples": float(work["num_examples"]),
  }
  if "error_feedback" in work:   # an encode stage's client residuals (client work)
    out.update(stage_measurements.flatten(work["error_feedback"], "error_feedback"))
  out.update(stage_measurements.flatten(measurements.get("distributor"), "distributor"))
  out.update(stage_measurements.aggregation_metrics(aggregation_plan,
                                                    measurements.get("aggregator")))
  out.update(stage_measurements.flatten(measurements.get("finalizer"), "finalizer"))
  return out


def check_converging(round_num: int, metrics: Mapping[str, float]) -> None:
  """Raises RunFailed if the round's training loss or server update is not finite."""
  if not math.isfinite(metrics[TRAIN_LOSS]) or metrics.get("finalizer/update_non_finite"):
    raise RunFailed(f"round {round_num}: training diverged ({TRAIN_LOSS} ="
                    f" {metrics[TRAIN_LOSS]}); try a smaller learning rate")
