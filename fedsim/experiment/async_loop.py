"""Asynchronous rounds on the simulated clock, for buffered algorithms (fedbuff).

`concurrency` clients are in flight at any time. A dispatched client downloads
the current model version (through the broadcast chain), trains on it
(computed at once for the whole dispatch group, kept until it arrives) and
arrives at dispatch time + download + compute + upload seconds
(`system.simulate_round` of its dispatch group, so profiles, jitter, dropout
and the exact wire bits apply as in synchronous rounds). Arrivals are taken in
(finish time, dispatch number) order; a client that dropped out or was offline
arrives with nothing, one staler than `max_staleness` is dropped (its upload
was sent), the others fill the buffer. A full buffer (`clients_per_round`
updates) is one server update, i.e. one "round" of the run loop: metrics,
evaluation and checkpoints count server updates. Freed slots are refilled once
every arrival at that instant has been handled, so clients that finish
together download the newest model; with equal finish times and concurrency =
clients_per_round, every update is a synchronous FedAvg round (same cohorts,
data shuffles and order).

Dispatch group g (the g-th refill) samples `sampler.sample(g, concurrency)`,
skips clients still in flight and takes as many as slots are free, and packs
their data with round g's seed: a pure function of (seed, g). The in-flight
clients, their computed updates and the counters are part of the checkpoint
(`ASYNC_STATE`), so a resumed run equals an uninterrupted one. Each server
update's dispatched and buffered clients (with their staleness) are returned
in its RoundResult, for `clients.csv`.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import json
import pathlib
import time
from typing import Any

import numpy as np

from fedsim.errors import RunFailed, UserError
from fedsim.experiment.round_result import RoundResult, round_metrics
from fedsim.experiment.round_clients import RoundClients
from fedsim.experiment.simulation import Simulation
from fedsim.system.clock import simulate_round
from fedsim.learning.buffered import BufferedAlgorithm, arrival
from fedsim.metric_names import (CLIENTS_AGGREGATED, CLIENTS_FAILED, ROUND_SIMULATED_SECONDS,
                                 ROUND_SKIPPED, SIMULATED_SECONDS)
from fedsim.backend import quiet

ASYNC_STATE = "async_state.npz"
# Dispatches without a single server update before the run gives up (every
# client failing, e.g. dropout_probability near 1).
_MAX_DISPATCHES_PER_UPDATE = 1000


@dataclasses.dataclass(order=True)
class InFlight:
  """A dispatched client, ordered by when it arrives (ties: dispatch order)."""

  finish: float                                   # simulated seconds at arrival
  dispatch: int                                   # dispatch number, from 1
  client: str = dataclasses.field(compare=False)
  version: int = dataclasses.field(compare=False)  # server version it downloaded
  group: int = dataclasses.field(compare=False)    # dispatch group (sampling seed)
  # Its dispatch output as NumPy ({update, update_weight, stats}), None if it fails.
  result: Any = dataclasses.field(compare=False)


def is_buffered(sim: Simulation) -> bool:
  """Whether the algorithm's plan plays buffered server updates (else synchronous rounds)."""
  return sim.algorithm.schedule == "buffered"


class BufferedRounds:
  """Plays server updates of a buffered algorithm; its state is checkpointed with the run.

  Keys of synchronous rounds it cannot honour (backup_clients,
  system.deadline_seconds, system.min_clients) are refused when the config is
  validated (`FedBuffParams.check_experiment`).

  Raises (constructor):
    UserError: more clients in flight than the data has.
  """

  def __init__(self, sim: Simulation, resume_from: pathlib.Path | None = None):
    config = sim.config
    algorithm: BufferedAlgorithm = sim.algorithm
    self.sim = sim
    self.concurrency = algorithm.concurrency or config.clients_per_round
    if self.concurrency > len(sim.data.client_ids):
      raise UserError(f"algorithm.concurrency: {self.concurrency} clients in flight, but"
                      f" data '{config.data.name}' has {len(sim.data.client_ids)} clients")
    self.in_flight: list[InFlight] = []
    self.free = self.concurrency   # slots freed and not yet refilled
    self.now = 0.0
    self.dispatches = 0
    self.groups = 0
    if resume_from is not None:
      self._restore(resume_from / ASYNC_STATE)

  def play_round(self, sim: Simulation, state, states, round_num: int, simulated_total: float,
                 sizes, run_dir: pathlib.Path, history, control_state) -> RoundResult:
    """Runs until the buffer is full and applies one server update.

    Same contract as the run loop's `_play_round`. Returns the RoundResult:
    `sampled` are the clients dispatched while the buffer filled (the refill
    after the previous update included), `aggregated` the buffered ones in
    arrival order, with their staleness.

    Raises:
      RunFailed: the update's training diverged, or clients never report.
    """
    del states, run_dir, history, control_state   # no client states, no controller
    config = sim.config
    version = round_num - 1
    buffer: list[tuple[InFlight, int]] = []
    dispatched: list[str] = []
    failed = stale = 0
    while len(buffer) < config.clients_per_round:
      if self.free and (not self.in_flight or self.in_flight[0].finish > self.now):
        state, chosen = self._dispatch(state, version)
        dispatched += chosen
        if len(dispatched) > _MAX_DISPATCHES_PER_UPDATE * config.clients_per_round:
          raise RunFailed(f"round {round_num}: {len(dispatched)} clients dispatched and"
                          f" {len(buffer)} updates arrived; do clients ever report?")
      client = heapq.heappop(self.in_flight)
      self.now, self.free = client.finish, self.free + 1
      staleness = version - client.version
      if client.result is None:
        failed += 1
      elif (sim.algorithm.max_staleness is not None
            and staleness > sim.algorithm.max_staleness):
        stale += 1
      else:
        buffer.append((client, staleness))
    arrivals = [arrival(c.result, staleness=s) for c, s in buffer]
    begin = time.perf_counter()
    with quiet.filtered_stderr():  # TFF compiles at the first call.
      state, measurements = sim.round_process.next(state, arrivals)
    seconds = time.perf_counter() - begin
    ages = [s for _, s in buffer]
    # Bits: downloads of this update's dispatches, uploads of its arrivals
    # (stale ones were sent, then dropped: `late_upload_bits`).
    metrics = round_metrics(round_num, measurements, sim.algorithm.aggregation_plan, {
        "clients/dispatched": len(dispatched),
        CLIENTS_AGGREGATED: len(buffer),
        CLIENTS_FAILED: failed,
        "clients/in_flight": len(self.in_flight),
        "staleness/mean": float(np.mean(ages)),
        "staleness/max": max(ages),
        "staleness/dropped": stale,
        ROUND_SKIPPED: 0,
        ROUND_SIMULATED_SECONDS: self.now - simulated_total,
        SIMULATED_SECONDS: self.now,
        "server_updates_per_hour": round_num * 3600.0 / self.now if self.now > 0 else 0.0,
    }, seconds=seconds, sizes=sizes, downloads=len(dispatched), uploads=len(buffer),
                            late_uploads=stale)
    return RoundResult(state, metrics, self.now, sampled=tuple(dispatched),
                       aggregated=tuple(c.client for c, _ in buffer), staleness=tuple(ages))

  def _dispatch(self, state, version: int):
    """Fills the free slots with clients that download the model of `state` now.

    Returns (`state`, its distributor state advanced; the ids dispatched, in
    the sampler's order).
    """
    sim, config = self.sim, self.sim.config
    self.groups += 1
    busy = {c.client for c in self.in_flight}
    candidates = sim.sampler.sample(self.groups, self.concurrency, key="algorithm.concurrency")
    chosen = [c for c in candidates if c not in busy][:self.free]
    clients = RoundClients(sim, self.groups, chosen)
    outcome = simulate_round(
        config.system, chosen, clients.num_examples(),
        len(chosen), config.seed, self.groups,
        wire_bits=(sim.wire.broadcast, sim.wire.aggregate), population=sim.data.client_ids)
    failed = set(outcome.failed)
    reporting = [c for c in chosen if c not in failed]
    trained = []
    if reporting:  # no client trains: no download, the distributor's state stays
      with quiet.filtered_stderr():  # TFF compiles at the first call.
        state, _, trained = sim.dispatch_process.next(state, clients.only(reporting))
    results = dict(zip(reporting, (_as_arrays(r) for r in trained)))
    for cid in chosen:
      self.dispatches += 1
      result = results.get(cid)
      heapq.heappush(self.in_flight, InFlight(
          finish=self.now + outcome.completion_seconds[cid], dispatch=self.dispatches,
          client=cid, version=version, group=self.groups, result=result))
    self.free -= len(chosen)
    return state, chosen

  def checkpoint_arrays(self) -> dict[str, np.ndarray]:
    """The in-flight clients (with their computed updates) and counters, as arrays."""
    flights = sorted(self.in_flight)
    index = {cid: i for i, cid in enumerate(self.sim.data.client_ids)}
    counters = {"free": self.free, "now": self.now, "dispatches": self.dispatches,
                "groups": self.groups}
    out = {
        "counters": np.frombuffer(json.dumps(counters).encode(), np.uint8),
        "finish": np.array([c.finish for c in flights], np.float64),
        "dispatch": np.array([c.dispatch for c in flights], np.int64),
        "client": np.array([index[c.client] for c in flights], np.int64),
        "version": np.array([c.version for c in flights], np.int64),
        "group": np.array([c.group for c in flights], np.int64),
        "reports": np.array([c.result is not None for c in flights], bool),
    }
    reporting = [c for c in flights if c.result is not None]
    for i, flight in enumerate(reporting):
      for j, u in enumerate(flight.result["update"]):
        out[f"r{i}_update_{j}"] = u
      out[f"r{i}_update_weight"] = flight.result["update_weight"]
      for key, value in flight.result["stats"].items():
        out[f"r{i}_stats_{key}"] = value
    return out

  def _restore(self, path: pathlib.Path) -> None:
    try:
      with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
      raise UserError(f"{path}: cannot read the asynchronous state ({e})") from None
    counters = json.loads(arrays["counters"].tobytes().decode())
    self.free, self.now = int(counters["free"]), float(counters["now"])
    self.dispatches, self.groups = int(counters["dispatches"]), int(counters["groups"])
    ids = self.sim.data.client_ids
    r = 0
    for i in range(len(arrays["finish"])):
      result = None
      if arrays["reports"][i]:
        prefix = f"r{r}_"
        r += 1
        n = sum(1 for k in arrays if k.startswith(prefix + "update_") and
                k != prefix + "update_weight")
        stats = collections.OrderedDict(
            (k[len(prefix + "stats_"):], arrays[k]) for k in arrays
            if k.startswith(prefix + "stats_"))
        result = collections.OrderedDict(
            update=tuple(arrays[f"{prefix}update_{j}"] for j in range(n)),
            update_weight=arrays[prefix + "update_weight"], stats=stats)
      self.in_flight.append(InFlight(
          finish=float(arrays["finish"][i]), dispatch=int(arrays["dispatch"][i]),
          client=ids[int(arrays["client"][i])], version=int(arrays["version"][i]),
          group=int(arrays["group"][i]), result=result))
    heapq.heapify(self.in_flight)


def _as_arrays(output) -> collections.OrderedDict:
  """A client's dispatch output from the runtime as NumPy, as checkpoints store it."""
  return collections.OrderedDict(
      update=tuple(np.asarray(u) for u in output["update"]),
      update_weight=np.asarray(output["update_weight"]),
      stats=collections.OrderedDict((k, np.asarray(v)) for k, v in output["stats"].items()))
