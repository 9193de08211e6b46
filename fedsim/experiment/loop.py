"""The round loop: schedule, sample, simulate the clock, run the round, record, call back.

The loop only plays rounds; what is written or shown (status, metrics.csv,
clients.csv, TensorBoard, checkpoints, evaluation, progress, hparams, the
final model, the user's `on_round`) is a callback (`fedsim.experiment.callbacks`,
which documents their order). A run resumed from a checkpoint continues
exactly where the checkpoint left off: the sampler, the device model and
client data shuffling are pure functions of (seed, round), and the server and
client states are restored bit for bit, so its rounds equal those of an
uninterrupted run. TFF's `run_training_process` is not used because it drives
an asyncio loop of its own, which fails inside Jupyter, and a fedsim round has
steps of its own around `next` (client packing, sizing, evaluation cadence).
"""

from __future__ import annotations

import pathlib
import time
from typing import Any, Callable, Mapping, Sequence

from fedsim.backend import quiet
from fedsim.compression.feedback import residual_ages
from fedsim.errors import HostError
from fedsim.experiment import run_state
from fedsim.experiment.callbacks import Callback, standard_callbacks
from fedsim.state.checkpoint import Checkpoint
from fedsim.state.client_states import ClientStateStore
from fedsim.experiment.round_info import RoundInfo
from fedsim.experiment.round_result import RoundResult, round_metrics
from fedsim.experiment.round_setting import RoundSetting, round_setting
from fedsim.experiment.run_state import Run, RunResult
from fedsim.experiment.round_clients import RoundClients
from fedsim.experiment.simulation import Simulation
from fedsim.system.clock import RoundOutcome, simulate_round
from fedsim.metric_names import (CLIENTS_AGGREGATED, CLIENTS_FAILED, ROUND_SIMULATED_SECONDS,
                                 ROUND_SKIPPED, SIMULATED_SECONDS)
from fedsim.runtime.mixed import Group, next_mixed
from fedsim.sizing import SizeInfo

__all__ = ["RunResult", "run_rounds"]


def run_rounds(sim: Simulation, run_dir: pathlib.Path, plain_config: dict[str, Any],
               progress: bool | None = None,
               check_runtime: Callable[[str], None] | None = None, *,
               resume_from: Checkpoint | None = None,
               on_round: Callable[[int, dict[str, float], RoundInfo], None] | None = None,
               user_callbacks: Sequence[Callback] = ()) -> RunResult:
  """Runs the rounds of `sim` (after `resume_from`, if given) into `run_dir`.

  A synchronous round is `_play_round`; a buffered algorithm's round is one
  server update, played by `async_loop.BufferedRounds`. `check_runtime(during)`
  raises RunFailed if the runtime died; it is asked when the run fails, so a
  dead worker is reported as such. `on_round(round, metrics, info)` is called
  after each round is logged and its checkpoint on disk (`info`: a RoundInfo), then
  `user_callbacks` (fedsim.Callback), which may end the run early (see
  `fedsim.experiment.callbacks`).

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
  run = Run(sim, run_dir, plain_config, resume_from)
  callbacks = standard_callbacks(progress, check_runtime, on_round, user_callbacks)
  try:
    callbacks.on_start(run)
    run_state.begin(run)
    play = run.player.play_round if run.player is not None else _play_round
    for run.round_num in range(run.start + 1, sim.config.rounds + 1):
      record = play(sim, run.state, run.states, run.round_num, run.simulated_seconds,
                    run.sizes, run_dir, run.history, run.control_state)
      run.state, run.simulated_seconds = record.state, record.simulated_seconds
      run.control_state = record.control_state
      stop = callbacks.after_round(run, record)
      run.history.append(record.metrics)
      if stop:
        break
    callbacks.on_end(run)
  except BaseException as e:
    raised = callbacks.on_error(run, e)
    if raised is e:
      raise
    raise raised from (None if isinstance(raised, HostError) else e)
  return run.result()


def _play_round(sim: Simulation, state, states: ClientStateStore | None, round_num: int,
                simulated_total: float, sizes: SizeInfo, run_dir: pathlib.Path,
                history: Sequence[Mapping[str, float]],
                control_state: dict | None) -> RoundResult:
  """Runs one synchronous round: sample, simulate the devices, run the process.

  Each round samples `clients_per_round + backup_clients` clients, lets the
  device model decide which of them are aggregated, and runs the process on
  those. A round with fewer reports than `system.min_clients` is skipped
  (logged in `events.log`), not failed. Each client runs, and is timed and
  sized at, its `RoundSetting`: the run's round, or with a controlled encoder
  parameter the round of the value its controller decided (from
  `control_state` and the metrics `history` of the rounds before).

  Returns:
    The RoundResult: new state, metrics, simulated seconds so far, the
    sampled and aggregated client ids.

  Raises:
    RunFailed: the round's training diverged.
  """
  config = sim.config
  sampled = sim.sampler.sample(round_num, config.clients_per_round + config.backup_clients)
  clients = RoundClients(sim, round_num, sampled)  # packed as the runtime reads them
  examples = clients.num_examples()
  setting = round_setting(sim, round_num, history, control_state, sampled, examples)
  wires = setting.wire
  # Each upload at its client's value; the broadcast is one for all (the run's
  # own when a Poisson round sampled nobody).
  round_wire = wires[sampled[0]] if sampled else sim.wire
  wire_bits = (round_wire.broadcast, {cid: w.aggregate for cid, w in wires.items()})
  # A Poisson sample aggregates every client drawn that reports in time.
  cap = len(sampled) if config.sampling == "poisson" else config.clients_per_round
  outcome = simulate_round(
      config.system, sampled, examples, cap, config.seed, round_num,
      wire_bits=wire_bits, population=sim.data.client_ids)
  simulated_total += outcome.round_seconds
  measurements, state_metrics, seconds = None, None, 0.0
  if outcome.skipped:
    _log_event(run_dir, f"round {round_num}: skipped, {len(outcome.sampled) - len(outcome.failed)}"
               f" of {len(outcome.sampled)} sampled clients reported, fewer than"
               f" system.min_clients={config.system.min_clients}")
  else:
    begin = time.perf_counter()
    state, measurements, state_metrics = _run_groups(
        sim, state, states, clients, outcome.aggregated, setting, round_num)
    seconds = time.perf_counter() - begin
  aggregated = set(outcome.aggregated)
  late = [cid for cid in outcome.uploaded if cid not in aggregated]
  # This round's static sizes: its broadcast, and each upload at its client's value.
  sizes.per_client = round_wire
  metrics = round_metrics(round_num, measurements, sim.algorithm.aggregation_plan,
                          _outcome_metrics(outcome, simulated_total), seconds=seconds,
                          sizes=sizes, downloads=len(outcome.sampled),
                          uploads=len(outcome.aggregated), late_uploads=len(late),
                          client_states=state_metrics,
                          upload_static=([wires[c].aggregate for c in outcome.aggregated],
                                         [wires[c].aggregate for c in late]))
  metrics.update(setting.metrics(outcome.aggregated or sampled))
  if sim.privacy is not None:
    # Rounds that aggregated released a noised mean; skipped ones released nothing.
    metrics.update(sim.privacy.round_metrics(sum(1 for b in sizes.aggregate_history if b)))
  return RoundResult(state, metrics, simulated_total, sampled=tuple(outcome.sampled),
                     aggregated=tuple(outcome.aggregated),  # () for a skipped round
                     control_state=setting.control_state,
                     client_values=setting.client_values(outcome.aggregated))


def _run_groups(sim: Simulation, state, states: ClientStateStore | None,
                clients: RoundClients, aggregated: Sequence[str],
                setting: RoundSetting, round_num: int):
  """The round of the `aggregated` clients, as groups of one round each
  (`fedsim.runtime.mixed`): each value's clients run that value's round (one
  group without a controller). Returns (state, measurements, error feedback's
  residual ages or None)."""
  by_process: dict[float | None, list[str]] = {}
  for cid in aggregated:
    by_process.setdefault(setting.values[cid], []).append(cid)
  groups = [Group(setting.process(value), clients.only(ids),
                  None if states is None else states.load(ids))
            for value, ids in by_process.items()]
  # A round compiles at its first call (in groups: its phases'), and Grappler logs known noise.
  with quiet.filtered_first_call([(g.process, "phases" if len(groups) > 1 else "round")
                                  for g in groups]):
    out = next_mixed(groups, state, sim.config.runtime.name)
  if states is None:
    return out[0], out[1], None
  order = [cid for ids in by_process.values() for cid in ids]
  ages = residual_ages(sim.algorithm.initial_client_state, states.last_updated(order), round_num)
  states.save(order, out[2], round_num)
  return out[0], out[1], ages


def _outcome_metrics(outcome: RoundOutcome, simulated_total: float) -> dict[str, float]:
  return {
      "clients/sampled": len(outcome.sampled),
      CLIENTS_AGGREGATED: len(outcome.aggregated),
      "clients/dropped": len(outcome.late) + len(outcome.failed),
      "clients/late": len(outcome.late),
      CLIENTS_FAILED: len(outcome.failed),
      ROUND_SKIPPED: int(outcome.skipped),
      ROUND_SIMULATED_SECONDS: outcome.round_seconds,
      SIMULATED_SECONDS: simulated_total,
  }


def _log_event(run_dir: pathlib.Path, message: str) -> None:
  """Appends a line to the run's `events.log` (skipped rounds and the like)."""
  with open(run_dir / "events.log", "a", encoding="utf-8") as f:
    f.write(message + "\n")
