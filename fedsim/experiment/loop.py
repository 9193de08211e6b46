"""The round loop: sample, pack, run one round of the process, evaluate, record.

The algorithm returns measurements; everything that is written (CSV,
TensorBoard, hparams, status, progress, checkpoints, the final model) happens
here. A run resumed from a checkpoint continues exactly where the checkpoint
left off: the sampler, the device model and client data shuffling are pure
functions of (seed, round), and the server and client states are restored
bit for bit, so its rounds equal those of an uninterrupted run. TFF's
`run_training_process` is not used because it drives an asyncio loop of its
own, which fails inside Jupyter, and a fedsim round has steps of its own
around `next` (client packing, sizing, evaluation cadence).
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any, Callable

import numpy as np

from fedsim.errors import HostError, RunFailed, host_error
from fedsim.experiment.checkpoint import (Checkpoint, check_free_space, export_model,
                                          restore_client_states, save_checkpoint,
                                          state_bytes)
from fedsim.experiment import async_loop
from fedsim.experiment.client_states import ClientStateStore
from fedsim.experiment.rewind import BITS_DIR, rewind_logs
from fedsim.experiment.round_info import RoundInfo
from fedsim.experiment.round_result import RoundResult, check_converging, process_metrics
from fedsim.experiment.simulation import RoundClients, Simulation, round_input
from fedsim.experiment.system import RoundOutcome, simulate_round
from fedsim.reporting import (CompositeSink, CsvSink, Progress, TensorBoardSink,
                              flat_hparams, read_metrics_csv, write_hparams, write_status)
from fedsim.backend import quiet
from fedsim.sizing import SizeInfo

FINAL_MODEL = "final_model.npz"
CLIENTS_CSV = "clients.csv"  # round, sampled, aggregated, staleness (see RoundResult.clients_row)


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
               check_runtime: Callable[[str], None] | None = None, *,
               resume_from: Checkpoint | None = None,
               on_round: Callable[[int, dict[str, float], RoundInfo], None] | None = None
               ) -> RunResult:
  """Runs the rounds of `sim` (after `resume_from`, if given) into `run_dir`.

  Each round samples `clients_per_round + backup_clients` clients, lets the
  device model decide which of them are aggregated, and runs the process on
  those. A round with fewer reports than `system.min_clients` is skipped (logged
  in `events.log`), not failed. A buffered algorithm's round is one server
  update instead, played by `async_loop.BufferedRounds`. Every
  `checkpoint.every` rounds and after the last, the whole state is checkpointed
  (see `checkpoint.py`); at the end the model is exported to `final_model.npz`.
  `check_runtime(during)` raises RunFailed if the runtime died; it is called
  when a round fails, so a dead worker is reported as such. `on_round(round,
  metrics, info)` is called after each round is logged and checkpointed (`info`:
  a RoundInfo). The ids of the clients each round sampled (dispatched) and
  aggregated, and the staleness of asynchronous updates, go to `clients.csv`
  (one row per round, see `RoundResult.clients_row`), cut back to the checkpoint
  on resume like metrics.csv.

  Returns:
    The RunResult with the metrics of every round, resumed ones included.

  Raises:
    UserError: too little free disk space for the checkpoints.
    RunFailed: the model diverged (non-finite loss) or the runtime died.
    HostError: a file of the run could not be written (e.g. 'no space left
      on device (writing P)').
    Completed rounds and the last good checkpoint stay on disk, `status`
    says 'failed' and why (or 'interrupted' after KeyboardInterrupt or
    SystemExit, which are re-raised), and the run can be resumed.
  """
  config = sim.config
  start = resume_from.round_num if resume_from is not None else 0
  round_num = start
  sinks = time_sink = bits_sink = clients_sink = None
  bar = Progress(config.rounds, enabled=progress, start_round=start)
  try:
    write_status(run_dir, "running")
    with quiet.filtered_stderr():  # TFF compiles `initialize`: grappler's known noise
      state = sim.round_process.initialize()
    sizes = SizeInfo(per_client=sim.wire)
    simulated_total = 0.0
    if resume_from is not None:
      state = resume_from.server_state(state)
      sizes.broadcast_history = list(resume_from.broadcast_history)
      sizes.aggregate_history = list(resume_from.aggregate_history)
      simulated_total = resume_from.simulated_seconds
      rewind_logs(run_dir, resume_from)
      if sim.algorithm.stateful_clients:
        restore_client_states(resume_from, run_dir / "client_states")
    states = (ClientStateStore(run_dir / "client_states", sim.algorithm.initial_client_state,
                               config.runtime.params.client_state_memory_mb * 2**20)
              if sim.algorithm.stateful_clients else None)
    check_free_space(run_dir, _disk_needed(sim, state, states))
    csv_sink = CsvSink(run_dir / "metrics.csv",
                       resume_after_round=start if resume_from is not None else None)
    history = read_metrics_csv(csv_sink.path) if start and csv_sink.path.exists() else []
    sizes.restore_entropy(history)
    clients_sink = CsvSink(run_dir / CLIENTS_CSV,
                           resume_after_round=start if resume_from is not None else None)
    sinks = CompositeSink([csv_sink, TensorBoardSink(run_dir)])
    # Eval accuracy against cumulative simulated milliseconds (TensorBoard's step axis).
    time_sink = TensorBoardSink(run_dir / "simulated_time")
    # And against cumulative bits sent both ways (the accuracy-vs-bits plot).
    bits_sink = TensorBoardSink(run_dir / BITS_DIR)
    time_step = _last_time_step(history)
    # Buffered (asynchronous) algorithms play their server updates on an event clock.
    player = (async_loop.BufferedRounds(sim, resume_from.path if resume_from else None)
              if async_loop.is_buffered(sim) else None)
    play = player.play_round if player is not None else _play_round
    for round_num in range(start + 1, config.rounds + 1):
      played = play(sim, state, states, round_num, simulated_total, sizes, run_dir)
      state, metrics, simulated_total = played.state, played.metrics, played.simulated_seconds
      clients_sink.write(round_num, played.clients_row())
      if round_num % config.eval.every == 0 or round_num == config.rounds:
        weights = sim.algorithm.model_weights(state)
        metrics.update(sim.evaluate(weights))
        if sim.evaluate_clients is not None:
          metrics.update(sim.evaluate_clients(weights, round_num))
        time_step = _time_step(simulated_total, time_step)
        time_sink.write(time_step, {"eval/accuracy": metrics["eval/accuracy"]})
        bits_sink.write(_bits_step(metrics), {"eval/accuracy": metrics["eval/accuracy"]})
      sinks.write(round_num, metrics)
      history.append(metrics)
      bar.update(round_num, metrics)
      if round_num % config.checkpoint.every == 0 or round_num == config.rounds:
        if states is not None:
          states.flush()  # the checkpoint links the directory: it must hold this round's states
        save_checkpoint(run_dir, round_num, state, simulated_total, sizes.broadcast_history,
                        sizes.aggregate_history, config.checkpoint.keep,
                        states.directory if states is not None else None,
                        extra_npz={async_loop.ASYNC_STATE: player.checkpoint_arrays()}
                        if player is not None else None)
      if on_round is not None:
        trained = [np.asarray(w) for w in sim.algorithm.model_weights(state).trainable]
        on_round(round_num, metrics, RoundInfo(trained, played.sampled, played.aggregated,
                                               played.staleness))
    weights = sim.algorithm.model_weights(state)
    export_model(run_dir / FINAL_MODEL, weights, sim.model.weight_names)
    final_weights = [np.asarray(w) for w in weights.trainable]
    result = RunResult(run_dir=run_dir, metrics=history, size_info=sizes,
                       final_weights=final_weights,
                       uncompressed_bits_per_client=(sim.uncompressed_wire.broadcast,
                                                     sim.uncompressed_wire.aggregate))
    final = result.final
    write_hparams(run_dir, flat_hparams(plain_config), {
        k: final[k] for k in ("eval/accuracy", "eval/loss", "train/loss",
                              "cumulative_broadcast_bits", "cumulative_aggregate_bits")
        if k in final}, step=config.rounds)
    for sink in (sinks, time_sink, bits_sink, clients_sink):
      sink.close()  # Flushes: a full disk shows here, before 'completed'.
    write_status(run_dir, "completed")
  except BaseException as e:
    for sink in (sinks, time_sink, bits_sink, clients_sink):
      _close_quietly(sink)
    raised = _record_ending(e, run_dir, check_runtime,
                            f"round {round_num}" if round_num > start else "start-up")
    if raised is e:
      raise
    raise raised from (None if isinstance(raised, HostError) else e)
  finally:
    bar.close()
  return result


def _time_step(simulated_seconds: float, previous: int) -> int:
  """The `simulated_time` step of an evaluation: simulated milliseconds.

  An evaluation after rounds that took no simulated time (every sampled
  client failed, no deadline) goes 1 ms after the previous one, so each
  evaluation keeps its own point (TensorBoard keeps one value per step).
  """
  return max(round(simulated_seconds * 1000), previous + 1)


def _last_time_step(history: list[dict[str, float]]) -> int:
  """The step of the last evaluation logged in `history` (-1 if none), for a resumed run."""
  step = -1
  for row in history:
    if "eval/accuracy" in row:
      step = _time_step(row["simulated_seconds"], step)
  return step


def _bits_step(metrics: dict[str, float]) -> int:
  """The `by_bits` step of an evaluation: bits sent so far, broadcast + aggregate."""
  return int(metrics.get("cumulative_broadcast_bits", 0)
             + metrics.get("cumulative_aggregate_bits", 0))


def _record_ending(error: BaseException, run_dir: pathlib.Path,
                   check_runtime: Callable[[str], None] | None, during: str) -> BaseException:
  """Writes the status of a run that `error` ended; returns what to raise.

  That is `error` itself, or what it means: a HostError for a file that could
  not be written, a RunFailed naming the dead runtime if `check_runtime`
  finds it dead.
  """
  raised = error
  if isinstance(error, (KeyboardInterrupt, SystemExit)):
    status = "interrupted"
  else:
    status = "failed"
    os_error = _os_error_of(error)
    if os_error is not None:
      raised = host_error(os_error, run_dir)
    elif check_runtime is not None:
      try:
        check_runtime(during)
      except RunFailed as dead:
        raised = dead
  message = "" if status == "interrupted" else (
      str(raised).splitlines()[0] if str(raised) else type(raised).__name__)
  try:
    write_status(run_dir, status, message)
  except OSError:
    pass  # Even the in-place rewrite failed; the raised error still says why.
  return raised


def _os_error_of(error: BaseException) -> OSError | None:
  """The OSError behind `error`: itself, or what a RunFailed was raised for."""
  if isinstance(error, OSError):
    return error
  if isinstance(error, RunFailed) and isinstance(error.__context__, OSError):
    return error.__context__  # e.g. export_model's 'cannot write P'
  return None


def _close_quietly(sink) -> None:
  """Closes a sink on a failing run; its own error would hide the first one."""
  if sink is None:
    return
  try:
    sink.close()
  except Exception:  # pylint: disable=broad-except
    pass


def _play_round(sim: Simulation, state, states: ClientStateStore | None, round_num: int,
                simulated_total: float, sizes: SizeInfo, run_dir: pathlib.Path):
  """Runs one round.

  Returns:
    The RoundResult: new state, metrics, simulated seconds so far, the
    sampled and aggregated client ids.

  Raises:
    RunFailed: the round's training diverged.
  """
  config = sim.config
  sampled = sim.sampler.sample(round_num, config.clients_per_round + config.backup_clients)
  clients = RoundClients(sim, round_num, sampled)  # packed as the runtime reads them
  outcome = simulate_round(
      config.system, sampled, clients.num_examples(),
      config.clients_per_round, config.seed, round_num,
      wire_bits=(sim.wire.broadcast, sim.wire.aggregate), population=sim.data.client_ids)
  simulated_total += outcome.round_seconds
  metrics: dict[str, float] = {"round": round_num}
  seconds = 0.0
  if outcome.skipped:
    _log_event(run_dir, f"round {round_num}: skipped, {len(outcome.sampled) - len(outcome.failed)}"
               f" of {len(outcome.sampled)} sampled clients reported, fewer than"
               f" system.min_clients={config.system.min_clients}")
  else:
    process = sim.round_process
    data = round_input(process, clients.only(outcome.aggregated))
    begin = time.perf_counter()
    # TFF compiles the round at its first call, and grappler logs known noise.
    with quiet.filtered_stderr():
      if states is None:
        state, measurements = process.next(state, data)
      else:
        state, measurements, new_states = process.next(
            state, data, states.load(outcome.aggregated))
        metrics.update(states.save(outcome.aggregated, new_states, round_num))  # residual ages
    seconds = time.perf_counter() - begin
    metrics.update(process_metrics(measurements, sim.algorithm.aggregation_plan))
    check_converging(round_num, metrics)
  metrics.update(_outcome_metrics(outcome, simulated_total))
  metrics["round_seconds"] = seconds
  metrics.update(sizes.round_metrics(len(outcome.sampled), len(outcome.aggregated),
                                     late_uploads=len(outcome.uploaded) - len(outcome.aggregated),
                                     measured=metrics))
  if sim.privacy is not None:
    # Rounds that aggregated released a noised mean; skipped ones released nothing.
    metrics.update(sim.privacy.round_metrics(sum(1 for b in sizes.aggregate_history if b)))
  return RoundResult(state, metrics, simulated_total, sampled=tuple(outcome.sampled),
                     aggregated=tuple(outcome.aggregated))  # () for a skipped round


def _disk_needed(sim: Simulation, state, states: ClientStateStore | None) -> int:
  """Bytes a run may still write: `keep` + 1 checkpoints (one being written),
  each with at most `every` rounds' worth of new client-state versions, the
  live client states, the exported model and 1 MiB of logs."""
  config = sim.config
  server = state_bytes(state)
  per_client = states.bytes_per_client() if states is not None else 0
  population = len(sim.data.client_ids)
  touched = min(population, config.checkpoint.every
                * (config.clients_per_round + config.backup_clients))
  return ((config.checkpoint.keep + 1) * (server + touched * per_client)
          + population * per_client + server + 2**20)


def _log_event(run_dir: pathlib.Path, message: str) -> None:
  """Appends a line to the run's `events.log` (skipped rounds and the like)."""
  with open(run_dir / "events.log", "a", encoding="utf-8") as f:
    f.write(message + "\n")
