"""The `ray` runtime on a two-node Ray cluster on loopback: it equals `inprocess`,
runs in sequence share their actors (and give what fresh actors give), survives a
worker that dies mid-round, reports one that stays dead in one line, and leaves
no Ray process behind.

One cluster (tests/ray_cluster.py) serves every Ray module of the session; each
node has one CPU, so the two workers of a run land on different nodes.

Starting a run's two actors costs seconds of CPU each (TensorFlow's import), so
the tests run in an order (pytest keeps the file's) where new actors start only
where a test needs them: the runs first lease the actors test_tff_stages.py left
idle; the interrupted run kills them just before the `keep_workers: false` run,
which starts its own anyway and ends them; the sequence test's fresh actors then
serve the takeover, which ends them; the dying workers, actors of another class,
come last.
"""

from __future__ import annotations

import functools
import os
import pathlib
import time

import numpy as np
import pytest

import fedsim
from fedsim.errors import RunFailed, UserError
from fedsim.experiment.config.loader import parse_config, plain
from fedsim.runtime import cluster
from fedsim.runtime.cluster import pool
from tests.ray_cluster import ARMED


CONFIG = {
    "name": "ray", "seed": 3, "rounds": 2, "clients_per_round": 4,
    "data": {"name": "digits", "num_clients": 8, "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg",
                  "client_optimizer": {"name": "sgd", "learning_rate": 0.3}},
    "runtime": {"name": "inprocess", "device": "cpu"},
}
EIGHT_BITS = {"aggregation": {"encoder": "uniform", "bits": 8, "min_elements": 1}}


class DyingWorker(cluster.ClientWorker):
  """A worker whose process exits mid-round once, when the test arms it."""

  def run_ids(self, run, round_num, ids, client_input, zero):
    armed = os.environ.get(ARMED, "")
    try:
      os.rename(armed, armed + ".claimed")  # atomic: one actor of the round claims it
    except OSError:
      return super().run_ids(run, round_num, ids, client_input, zero)
    os._exit(1)


def _flat(value) -> list[np.ndarray]:
  import tensorflow_federated as tff
  return [np.asarray(v) for v in tff.structure.flatten(
      tff.structure.from_container(value, recursive=True))]


def _on_ray(config: dict, address: str, **keys) -> dict:
  return {**config, "runtime": {"name": "ray", "address": address, "workers": 2,
                                "device": "cpu", **keys}}


def _idle_pids() -> list[int]:
  import ray
  return sorted(ray.get([actor.pid.remote() for actor in pool.idle_actors()], timeout=60))


def _assert_close(got, want, exact: bool) -> None:
  for g, w in zip(_flat(got), _flat(want), strict=True):
    if exact:
      np.testing.assert_array_equal(g, w)
    else:
      np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


# `-m long`: the error-feedback run below makes the same comparison (its clients
# keep state as well) and checks the sizes, example counts and disconnection too.
@pytest.mark.slow
@pytest.mark.long
def test_a_run_on_the_cluster_equals_inprocess(ray_cluster, tmp_path):
  """fedsim.run on the cluster (FedAvg, no compression) against the rounds the
  loop plays (every sampled client aggregated) on `inprocess`."""
  from fedsim.experiment.round_clients import RoundClients
  from fedsim.experiment.simulation import build_simulation
  address, _ = ray_cluster
  sim = build_simulation(parse_config(CONFIG))
  state = sim.round_process.initialize()
  for round_num in (1, 2):
    clients = RoundClients(sim, round_num, sim.sampler.sample(round_num, 4))
    state, _ = sim.round_process.next(state, clients)
  want = [np.asarray(w) for w in sim.algorithm.model_weights(state).trainable]
  got = fedsim.run({**CONFIG, "runtime": {"name": "ray", "address": address, "workers": 2,
                                          "device": "cpu"}},
                   logdir=tmp_path, progress=False)
  for g, w in zip(got.final_weights, want, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
  assert not np.allclose(want[0], sim.model.initial_weights.trainable[0])
  assert got.size_info.per_client == sim.wire
  assert [m["train/num_examples"] for m in got.metrics] == [
      sum(sim.data.client_size(c) for c in sim.sampler.sample(r, 4)) for r in (1, 2)]
  assert len(pool.idle_actors()) == 2  # the run ended cleanly: its actors wait for the next


@pytest.mark.slow
def test_fedbuff_clients_train_on_the_cluster_as_on_inprocess(ray_cluster, tmp_path):
  """A buffered algorithm's dispatch is a round of the run: the actors build it on
  first use and send each client's result back (inprocess equals local:
  test_contract)."""
  from tests.runtime.test_contract import FEDBUFF
  address, _ = ray_cluster
  want = fedsim.run({**FEDBUFF, "runtime": {"name": "inprocess", "device": "cpu"}},
                    logdir=tmp_path / "inprocess", progress=False)
  got = fedsim.run({**FEDBUFF, "runtime": {"name": "ray", "address": address, "workers": 2,
                                           "device": "cpu"}},
                   logdir=tmp_path / "ray", progress=False)
  for g, w in zip(got.final_weights, want.final_weights, strict=True):
    np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
  for a, b in zip(want.metrics, got.metrics, strict=True):
    np.testing.assert_allclose(b["train/loss"], a["train/loss"], rtol=1e-6)
    assert b["staleness/mean"] == a["staleness/mean"]


@pytest.mark.slow
def test_a_controlled_run_with_per_client_bits_on_the_cluster_equals_inprocess(
    ray_cluster, tmp_path):
  """link_budget gives clients on slow and fast uplinks different bits in one
  round: each value's round is built by the actors on first use, and the
  groups merge on the driver as on `inprocess`."""
  address, _ = ray_cluster
  # 2 rounds, at most 4 bits: the clients get 1 and 4 bits in round 1, all 4 in
  # round 2 (each value a round the actors build).
  config = {**CONFIG, "rounds": 2, "system": {
      "seconds_per_example": 0.001, "deadline_seconds": 0.45,
      "profiles": {"up_bps": {"median": 3e4, "sigma": 1.0}}},
            "aggregation": [{"name": "encode", "encoder": "uniform", "min_elements": 100,
                             "rounding": "deterministic",
                             "bits": {"controller": "link_budget", "initial": 2, "max": 4}}]}
  want = fedsim.run(config, logdir=tmp_path / "inprocess", progress=False)
  got = fedsim.run({**config, "runtime": {"name": "ray", "address": address, "workers": 2,
                                          "device": "cpu"}},
                   logdir=tmp_path / "ray", progress=False)
  assert any(m["control/bits_min"] < m["control/bits_max"] for m in want.metrics)
  for g, w in zip(got.final_weights, want.final_weights, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
  for a, b in zip(want.metrics, got.metrics, strict=True):
    assert (b["control/bits_mean"], b["aggregate_bits"]) == (
        a["control/bits_mean"], a["aggregate_bits"])


@pytest.mark.slow
def test_an_interrupted_runs_actors_are_killed_not_kept(ray_cluster, tmp_path):
  import ray
  address, _ = ray_cluster
  config = _on_ray({**CONFIG, "rounds": 1}, address)
  fedsim.run(config, logdir=tmp_path, progress=False)
  leased = pool.idle_actors()  # what the next run of the same shape takes
  assert len(leased) == 2

  def interrupt(round_num, metrics):
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    fedsim.run({**config, "rounds": 2}, logdir=tmp_path, progress=False, on_round=interrupt)
  assert pool.idle_actors() == []
  for actor in leased:
    with pytest.raises(ray.exceptions.RayActorError):
      ray.get(actor.pid.remote(), timeout=60)


STATEFUL = {
    "ef": {"aggregation": [{"name": "encode", "encoder": "topk", "k": 20,
                            "min_elements": 100, "error_feedback": True}]},
    "scaffold": {"algorithm": {"name": "scaffold"}}}


# SCAFFOLD's states on the cluster are `-m long`: the mechanism (states travel
# with their chunk) is the same as error feedback's, and test_client_states'
# chunks-run-apart test keeps SCAFFOLD's merge equal to TFF's runtime.
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["ef", pytest.param("scaffold", marks=pytest.mark.long)])
def test_clients_that_keep_state_on_the_cluster_equal_inprocess(ray_cluster, tmp_path, variant):
  """Error feedback and SCAFFOLD: each client's state travels with its chunk to
  a worker on either node and comes back to the driver's store."""
  address, _ = ray_cluster
  ray_runtime = {"name": "ray", "address": address, "workers": 2, "device": "cpu",
                 "keep_workers": False}
  config = {**CONFIG, "rounds": 3, "data": {**CONFIG["data"], "num_clients": 6},
            "variants": {variant: STATEFUL[variant]}}
  want = fedsim.run(config, logdir=tmp_path / "inprocess", progress=False)
  got = fedsim.run({**config, "runtime": ray_runtime}, logdir=tmp_path / "ray", progress=False)
  got, want = got[variant], want[variant]
  for g, w in zip(got.final_weights, want.final_weights, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
  for a, b in zip(want.metrics, got.metrics, strict=True):
    np.testing.assert_allclose(b["train/loss"], a["train/loss"], rtol=1e-6)
    assert b["train/num_examples"] == a["train/num_examples"]
  states = sorted(p.name for p in (got.run_dir / "client_states").iterdir())
  assert states == sorted(p.name for p in (want.run_dir / "client_states").iterdir())
  assert len(states) >= 4  # 4 of 6 clients a round for 3 rounds
  assert got.size_info.per_client == want.size_info.per_client
  if variant == "ef":
    assert any(m["error_feedback/residual_norm"] > 0 for m in got.metrics)
  import ray
  assert not ray.is_initialized()  # keep_workers: false: the run killed its actors, disconnected


@pytest.mark.slow
def test_runs_in_sequence_share_the_actors_and_give_what_fresh_actors_give(
    ray_cluster, tmp_path):
  """Two different runs, then the first again, on the same two actor processes:
  each equals its `inprocess` run, and the repeat (on actors that built and ran
  another run since) equals the first run (on fresh actors) bit for bit. The
  first run's clients round their updates at random (8-bit stochastic
  quantization): a random state left in an actor would change the repeat. (One
  round: in the second, the chunks' float rounding can move a stochastically
  rounded value by a level, 1e-3 from `inprocess` with or without kept actors;
  docs/guides/ray.md.)"""
  address, _ = ray_cluster
  cluster.release()  # fresh actors for the first run
  compressed = {**CONFIG, "seed": 5, "rounds": 1, "compression": EIGHT_BITS}
  first = fedsim.run(_on_ray(compressed, address), logdir=tmp_path / "ray", progress=False)
  pids = _idle_pids()
  assert len(pids) == 2
  second = fedsim.run(_on_ray(CONFIG, address), logdir=tmp_path / "ray", progress=False)
  assert _idle_pids() == pids
  again = fedsim.run(_on_ray(compressed, address), logdir=tmp_path / "ray", progress=False)
  assert _idle_pids() == pids
  for g, w in zip(again.final_weights, first.final_weights, strict=True):
    np.testing.assert_array_equal(g, w)
  timeless = lambda run: [{k: v for k, v in m.items() if k != "round_seconds"}
                          for m in run.metrics]
  assert timeless(again) == timeless(first)
  for got, config in ((first, compressed), (second, CONFIG)):
    want = fedsim.run(config, logdir=tmp_path / "inprocess", progress=False)
    for g, w in zip(got.final_weights, want.final_weights, strict=True):
      np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    for a, b in zip(want.metrics, got.metrics, strict=True):
      np.testing.assert_allclose(b["train/loss"], a["train/loss"], rtol=1e-6)
  assert not np.allclose(first.final_weights[0], second.final_weights[0])


@pytest.mark.slow
def test_a_connection_of_fedsims_is_taken_over_and_anothers_refused(ray_cluster, tmp_path):
  """The study executor's `connect` ends the runs' pool (its actors too); a run
  then finds Ray connected by someone else and refuses it in one line."""
  import ray
  address, _ = ray_cluster
  config = _on_ray({**CONFIG, "rounds": 1}, address)
  fedsim.run(config, logdir=tmp_path, progress=False)
  kept = _idle_pids()  # the actors run on this machine
  assert len(kept) == 2
  try:
    assert pool.connect(address, "--ray-address", num_cpus=1) is None
    assert pool.idle_actors() == [] and ray.is_initialized()
    deadline = time.monotonic() + 60  # ray.kill returns before they exit
    while any(os.path.exists(f"/proc/{pid}") for pid in kept):
      assert time.monotonic() < deadline, "the pool's actors were not killed"
      time.sleep(0.2)
    with pytest.raises(UserError, match=r"^runtime.address: Ray is already initialized in"
                                        r" this process; call ray.shutdown\(\) first"):
      fedsim.run(config, logdir=tmp_path, progress=False)
  finally:
    ray.shutdown()


@pytest.fixture(scope="module")
def on_cluster(ray_cluster):
  """(inprocess simulation, a ClusterProcess of DyingWorkers of the same config),
  FedAvg with 8-bit uniform compression of the clients' updates."""
  from fedsim.experiment.simulation import build_simulation, cluster_worker
  address, _ = ray_cluster
  config = parse_config({**CONFIG, "compression": EIGHT_BITS})
  sim = build_simulation(config)
  assert sim.wire.aggregate < sim.uncompressed_wire.aggregate  # it does compress
  process = cluster.ClusterProcess(
      sim.round_process, functools.partial(cluster_worker, plain(config), "cpu"),
      cluster.ClusterSpec(address=address, workers=2, device="cpu", timeout_s=300),
      worker_class=DyingWorker)
  yield sim, process
  process.close()


def _round(sim, round_num, ids):
  from fedsim.experiment.round_clients import RoundClients
  return RoundClients(sim, round_num, ids)


@pytest.mark.slow
def test_one_chunk_is_bit_for_bit_inprocess_and_two_chunks_merge_to_it(on_cluster):
  sim, process = on_cluster
  state = sim.round_process.initialize()
  ids = sim.sampler.sample(1, 4)
  one = _round(sim, 1, ids[:1])   # a single client: one chunk, as inprocess runs it
  _assert_close(process.next(state, one), sim.round_process.next(state, one), exact=True)
  four = _round(sim, 1, ids)
  got, want = process.next(state, four), sim.round_process.next(state, four)
  _assert_close(got, want, exact=False)
  assert float(got[1]["client_work"]["num_examples"]) == float(sum(
      sim.data.client_size(c) for c in ids))  # one epoch over every client's examples


@pytest.mark.slow
def test_a_worker_that_dies_mid_round_is_restarted_and_its_chunk_rerun(on_cluster, ray_cluster):
  sim, process = on_cluster
  _, temp_dir = ray_cluster
  before = process.worker_pids()
  state = sim.round_process.initialize()
  clients = _round(sim, 2, sim.sampler.sample(2, 4))
  pathlib.Path(temp_dir, "armed").touch()
  got = process.next(state, clients)
  assert pathlib.Path(temp_dir, "armed.claimed").exists()  # a worker did exit
  after = process.worker_pids()
  assert sum(a != b for a, b in zip(after, before)) == 1
  _assert_close(got, sim.round_process.next(state, clients), exact=False)


@pytest.mark.slow
def test_a_worker_that_stays_dead_fails_the_round_in_one_line(on_cluster):
  # Runs last on the shared process: it leaves worker 1 dead.
  sim, process = on_cluster
  import ray
  ray.kill(process.actors[1], no_restart=True)
  state = sim.round_process.initialize()
  with pytest.raises(RunFailed, match=r"^round 3: ray worker 1 died") as error:
    process.next(state, _round(sim, 3, sim.sampler.sample(3, 4)))
  assert "\n" not in str(error.value)
