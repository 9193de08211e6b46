"""What the run loop carries from round to round, and what a finished run returns.

A `Run` is what callbacks see: the simulation, the run directory, the server
state, the bits and simulated seconds so far, the client-state store, the
buffered schedule's player and the metrics of every round logged so far.
`begin` builds its state: initialized, or restored from a checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Callable

import numpy as np

from fedsim.backend import quiet
from fedsim.experiment import async_loop
from fedsim.state.checkpoint import Checkpoint, restore_client_states
from fedsim.state.durable import check_free_space, state_bytes
from fedsim.state.client_states import ClientStateStore
from fedsim.experiment.simulation import Simulation
from fedsim.sizing import SizeInfo

CLIENT_STATES = "client_states"  # the run directory's live client states


@dataclasses.dataclass
class RunResult:
  """What a finished run leaves: its directory, metrics and sizes."""

  run_dir: pathlib.Path
  metrics: list[dict[str, float]]   # one dict per round, as in metrics.csv
  size_info: SizeInfo
  final_weights: list[np.ndarray]   # trainable weights of the evaluated model
  # () -> (broadcast, aggregate) bits per client of the run without its encoders:
  # `uncompressed_bits_per_client`, sized when first read.
  size_uncompressed: Callable[[], tuple[int, int]]
  # The chain whose encoder parameter a controller sets ('aggregation' or
  # 'broadcast'): its size per client changes between rounds (or clients).
  controlled_direction: str | None = None

  @functools.cached_property
  def uncompressed_bits_per_client(self) -> tuple[int, int]:
    """(broadcast, aggregate) bits per client of the same run without its encoders."""
    return self.size_uncompressed()

  @property
  def final(self) -> dict[str, float]:
    """The last value of each metric over the run."""
    return final_metrics(self.metrics)


def final_metrics(history: list[dict[str, float]]) -> dict[str, float]:
  """The last value of each metric over `history` (rows of metrics.csv)."""
  out: dict[str, float] = {}
  for row in history:
    out.update(row)
  return out


@dataclasses.dataclass
class Run:
  """One run in progress, as the loop and its callbacks share it.

  Attributes:
    round_num: the round being played, or the last one played before the
      first (`start`) until the loop begins.
    state: the server state after `round_num` (None until `begin`).
    simulated_seconds: simulated seconds since the run began.
    sizes: bits sent so far (None until `begin`).
    states: the clients' states, for algorithms whose clients keep state.
    player: the buffered (asynchronous) schedule, None for synchronous rounds.
    control_state: the controller's state, None without one.
    history: metrics of every round logged so far, resumed ones included
      (the metrics.csv callback reads them back on resume).
    stopped_by: the name of the callback that ended the run early (its
      `after_round` returned True), None while the run goes on.
  """

  sim: Simulation
  run_dir: pathlib.Path
  plain_config: dict[str, Any]
  resume_from: Checkpoint | None = None
  round_num: int = 0
  state: Any = None
  simulated_seconds: float = 0.0
  sizes: SizeInfo | None = None
  states: ClientStateStore | None = None
  player: async_loop.BufferedRounds | None = None
  history: list[dict[str, float]] = dataclasses.field(default_factory=list)
  # A controlled encoder parameter's controller state (server state: checkpointed).
  control_state: dict | None = None
  stopped_by: str | None = None

  def __post_init__(self):
    self.round_num = self.start

  @property
  def start(self) -> int:
    """Rounds done before this process took the run over (0 for a new run)."""
    return self.resume_from.round_num if self.resume_from is not None else 0

  def trained_weights(self) -> list[np.ndarray]:
    """The global model's trainable weights, as NumPy arrays in variable order."""
    return [np.asarray(w) for w in self.sim.algorithm.model_weights(self.state).trainable]

  def result(self) -> RunResult:
    return RunResult(run_dir=self.run_dir, metrics=self.history, size_info=self.sizes,
                     final_weights=self.trained_weights(),
                     # Holds what the reference is built from, not the run's simulation.
                     size_uncompressed=functools.partial(_bits_pair, self.sim.size_uncompressed),
                     controlled_direction=(self.sim.control.controlled.direction
                                           if self.sim.control is not None else None))


def _bits_pair(size: Callable[[], Any]) -> tuple[int, int]:
  wire = size()
  return wire.broadcast, wire.aggregate


def begin(run: Run) -> None:
  """Builds `run`'s state: the process's initial state, or the checkpoint's.

  Raises:
    UserError: too little free disk space for the checkpoints, or more
      clients in flight than the data has (buffered schedule).
  """
  sim, checkpoint = run.sim, run.resume_from
  with quiet.filtered_stderr():  # TFF compiles `initialize`: grappler's known noise
    run.state = sim.round_process.initialize()
  run.sizes = SizeInfo(per_client=sim.wire)
  if checkpoint is not None:
    run.state = checkpoint.server_state(run.state)
    run.sizes.broadcast_history = list(checkpoint.broadcast_history)
    run.sizes.aggregate_history = list(checkpoint.aggregate_history)
    run.simulated_seconds = checkpoint.simulated_seconds
    if sim.algorithm.stateful_clients:
      restore_client_states(checkpoint, run.run_dir / CLIENT_STATES)
  run.sizes.restore_entropy(run.history)  # metrics.csv alone keeps them
  if sim.control is not None:
    run.control_state = (checkpoint.control_state() if checkpoint is not None
                         else sim.control.initial_state())
  if sim.algorithm.stateful_clients:
    run.states = ClientStateStore(run.run_dir / CLIENT_STATES, sim.algorithm.initial_client_state,
                                  sim.config.runtime.params.client_state_memory_mb * 2**20)
  check_free_space(run.run_dir, _disk_needed(sim, run.state, run.states))
  # Buffered (asynchronous) algorithms play their server updates on an event clock.
  if async_loop.is_buffered(sim):
    run.player = async_loop.BufferedRounds(sim, checkpoint.path if checkpoint else None)


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
