"""The round loop: sample, pack, run one round of the process, evaluate, record.

The algorithm returns measurements; everything that is written (CSV,
TensorBoard, hparams, status, progress) happens here. TFF's
`run_training_process` is not used because it drives an asyncio loop of its
own, which fails inside Jupyter, and a fedsim round has steps of its own
around `next` (client packing, sizing, evaluation cadence).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import time
from typing import Any, Callable

import numpy as np

from fedsim.errors import RunFailed
from fedsim.experiment.client_states import ClientStateStore
from fedsim.experiment.simulation import Simulation, client_batches
from fedsim.experiment.system import RoundOutcome, simulate_round
from fedsim.reporting import (CompositeSink, CsvSink, Progress, TensorBoardSink,
                              flat_hparams, write_hparams, write_status)
from fedsim.sizing import SizeInfo


@dataclasses.dataclass
class RunResult:
  """What a finished run leaves: its directory, metrics and sizes."""

  run_dir: pathlib.Path
  metrics: list[dict[str, float]]   # one dict per round, as in metrics.csv
  size_info: SizeInfo
  final_weights: list[np.ndarray]   # trainable weights of the evaluated model
  uncompressed_bits_per_client: tuple[int, int]  # (broadcast, aggregate)

  @property
  def final(self) -> dict[str, float]:
    """The last value of each metric over the run."""
    out: dict[str, float] = {}
    for row in self.metrics:
      out.update(row)
    return out


def _round_metrics(measurements) -> dict[str, float]:
  work = measurements["client_work"]
  out = {
      "train/loss": float(work["loss"]),
      "train/accuracy": float(work["accuracy"]),
      "train/num_examples": float(work["num_examples"]),
  }
  finalizer = measurements.get("finalizer") or {}
  if "update_non_finite" in finalizer:
    out["server/update_non_finite"] = float(finalizer["update_non_finite"])
  return out


def _outcome_metrics(outcome: RoundOutcome, simulated_total: float) -> dict[str, float]:
  return {
      "clients/sampled": len(outcome.sampled),
      "clients/aggregated": len(outcome.aggregated),
      "clients/dropped": len(outcome.late) + len(outcome.failed),
      "clients/late": len(outcome.late),
      "clients/failed": len(outcome.failed),
      "round_skipped": int(outcome.skipped),
      "round_simulated_seconds": outcome.round_seconds,
      "simulated_seconds": simulated_total,
  }


def run_rounds(sim: Simulation, run_dir: pathlib.Path, plain_config: dict[str, Any],
               progress: bool | None = None,
               check_runtime: Callable[[str], None] | None = None) -> RunResult:
  """Runs every round of `sim`, writing outputs into `run_dir`.

  Each round samples `clients_per_round + backup_clients` clients, lets the
  device model decide which of them are aggregated, and runs the process on
  those. A round with fewer reports than `system.min_clients` is skipped
  (logged in `events.log`), not failed. `check_runtime(during)` raises
  RunFailed if the runtime died; it is called when a round fails, so a dead
  worker is reported as such.

  Raises:
    RunFailed: the model diverged (non-finite loss) or the runtime died;
      metrics of completed rounds stay on disk and `status` says 'failed'.
  """
  config = sim.config
  sinks = CompositeSink([CsvSink(run_dir / "metrics.csv"), TensorBoardSink(run_dir)])
  # Eval accuracy against cumulative simulated seconds (TensorBoard's step axis).
  time_sink = TensorBoardSink(run_dir / "simulated_time")
  bar = Progress(config.rounds, enabled=progress)
  sizes = SizeInfo(per_client=sim.wire)
  history: list[dict[str, float]] = []
  process = sim.algorithm.process
  states = (ClientStateStore(run_dir / "client_states", sim.algorithm.initial_client_state)
            if sim.algorithm.stateful_clients else None)
  simulated_total = 0.0
  write_status(run_dir, "running")
  round_num = 0
  try:
    state = process.initialize()
    for round_num in range(1, config.rounds + 1):
      sampled = sim.sampler.sample(round_num, config.clients_per_round + config.backup_clients)
      packed = client_batches(sim, round_num, sampled)
      outcome = simulate_round(
          config.system, sampled, {c: float(packed[c]["mask"].sum()) for c in sampled},
          config.clients_per_round, config.seed, round_num)
      simulated_total += outcome.round_seconds
      metrics: dict[str, float] = {"round": round_num}
      seconds = 0.0
      if outcome.skipped:
        _log_event(run_dir, f"round {round_num}: skipped, {len(outcome.sampled) - len(outcome.failed)}"
                   f" of {len(outcome.sampled)} sampled clients reported, fewer than"
                   f" system.min_clients={config.system.min_clients}")
      else:
        data = [packed[c] for c in outcome.aggregated]
        start = time.perf_counter()
        if states is None:
          state, measurements = process.next(state, data)
        else:
          state, measurements, new_states = process.next(
              state, data, states.load(outcome.aggregated))
          states.save(outcome.aggregated, new_states)
        seconds = time.perf_counter() - start
        metrics.update(_round_metrics(measurements))
        if not math.isfinite(metrics["train/loss"]) or metrics.get("server/update_non_finite"):
          raise RunFailed(f"round {round_num}: training diverged (train/loss ="
                          f" {metrics['train/loss']}); try a smaller learning rate")
      metrics.update(_outcome_metrics(outcome, simulated_total))
      metrics["round_seconds"] = seconds
      metrics.update(sizes.round_metrics(len(outcome.sampled), len(outcome.aggregated)))
      if round_num % config.eval.every == 0 or round_num == config.rounds:
        metrics.update(sim.evaluate(sim.algorithm.model_weights(state)))
        time_sink.write(round(simulated_total), {"eval/accuracy": metrics["eval/accuracy"]})
      sinks.write(round_num, metrics)
      history.append(metrics)
      bar.update(round_num, metrics)
    final_weights = [np.asarray(w) for w in sim.algorithm.model_weights(state).trainable]
  except BaseException as e:
    write_status(run_dir, "failed", str(e).splitlines()[0] if str(e) else type(e).__name__)
    if check_runtime is not None and not isinstance(e, (RunFailed, KeyboardInterrupt)):
      check_runtime(f"round {round_num}")
    raise
  finally:
    bar.close()
    sinks.close()
    time_sink.close()
  final = {}
  for row in history:
    final.update(row)
  write_hparams(run_dir, flat_hparams(plain_config), {
      k: final[k] for k in ("eval/accuracy", "eval/loss", "train/loss",
                            "cumulative_broadcast_bits", "cumulative_aggregate_bits")
      if k in final})
  write_status(run_dir, "completed")
  return RunResult(run_dir=run_dir, metrics=history, size_info=sizes,
                   final_weights=final_weights,
                   uncompressed_bits_per_client=(sim.uncompressed_wire.broadcast,
                                                 sim.uncompressed_wire.aggregate))


def _log_event(run_dir: pathlib.Path, message: str) -> None:
  """Appends a line to the run's `events.log` (skipped rounds and the like)."""
  with open(run_dir / "events.log", "a", encoding="utf-8") as f:
    f.write(message + "\n")
