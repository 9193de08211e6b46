"""RoundClients: a round's clients packed on access, as the seeded `pack` packs them."""

from __future__ import annotations

import collections.abc
import types

import numpy as np
import pytest

from fedsim.data.federated import Examples, federate
from fedsim.data.packing import pack
from fedsim.experiment.round_clients import RoundClients, pack_client
from fedsim.seeds import PACK_STREAM
from fedsim.task import ClientPlan

SEED, ROUND, BATCH = 3, 5, 10
SIZES = (3, 7, 10, 23, 45)  # below, at and above the batch size


def fake_sim(plan: ClientPlan, cap: int | None = None):
  """What RoundClients reads of a Simulation: data, seed, batching and the client plan."""
  rng = np.random.default_rng(0)
  parts = [Examples(rng.random((n, 4), dtype=np.float32), rng.integers(0, 3, n, dtype=np.int32))
           for n in SIZES]
  test = Examples(np.zeros((1, 4), np.float32), np.zeros(1, np.int32))
  data = federate(parts, test, num_classes=3, max_examples_per_client=cap, seed=SEED)
  params = types.SimpleNamespace(batch_size=BATCH, shuffle=True)
  config = types.SimpleNamespace(seed=SEED, data=types.SimpleNamespace(params=params))
  return types.SimpleNamespace(config=config, data=data,
                               algorithm=types.SimpleNamespace(client_plan=plan))


PLANS = {"one_epoch": (ClientPlan(), None), "three_epochs": (ClientPlan(epochs=3), None),
         "steps": (ClientPlan(steps=4), None), "capped": (ClientPlan(epochs=2), 8),
         "capped_steps": (ClientPlan(steps=3), 8)}


@pytest.mark.parametrize("name", PLANS)
def test_counts_equal_the_mask_sums_of_the_packed_clients(name):
  sim = fake_sim(*PLANS[name])
  ids = sim.data.client_ids[::-1]  # any order
  clients = RoundClients(sim, ROUND, ids)
  counts = clients.num_examples()
  assert list(counts) == list(ids)
  assert [counts[c] for c in ids] == [float(p["mask"].sum()) for p in clients]


@pytest.mark.parametrize("name", PLANS)
def test_a_client_packs_as_pack_with_its_round_and_population_index(name):
  sim = fake_sim(*PLANS[name])
  plan = PLANS[name][0]
  ids = sim.data.client_ids[1::2]
  clients = RoundClients(sim, ROUND, ids)
  assert len(clients) == len(ids) and clients.ids == ids and clients.round_num == ROUND
  for k, cid in enumerate(ids):
    i = sim.data.client_ids.index(cid)
    want = pack(sim.data.clients[cid], BATCH, epochs=plan.epochs, steps=plan.steps,
                seed=[SEED, PACK_STREAM, ROUND, i])
    got = clients[k]
    for key in ("x", "y", "mask"):
      np.testing.assert_array_equal(got[key], getattr(want, key))
  # Each access packs anew, alike; `pack_client` gives the same arrays.
  np.testing.assert_array_equal(clients[0]["x"], clients[0]["x"])
  for cid, got in zip(ids, clients):
    np.testing.assert_array_equal(got["y"], pack_client(sim, ROUND, cid)["y"])


def test_slices_and_subsets_stay_lazy_rounds_of_the_same_round():
  sim = fake_sim(ClientPlan())
  clients = RoundClients(sim, ROUND, sim.data.client_ids)
  head = clients[:2]
  assert isinstance(head, RoundClients) and head.ids == sim.data.client_ids[:2]
  picked = clients.only(["client_0004", "client_0001"])
  assert picked.round_num == ROUND and picked.ids == ("client_0004", "client_0001")
  np.testing.assert_array_equal(picked[1]["x"], clients[1]["x"])
  with pytest.raises(IndexError):
    clients[len(SIZES)]


CONFIG = {
    "name": "lazy", "seed": 1, "rounds": 2, "clients_per_round": 4, "backup_clients": 2,
    "data": {"name": "emnist_synthetic", "num_clients": 12, "examples_per_client": 30,
             "test_examples": 40, "batch_size": 16, "epochs": 2, "max_examples_per_client": 25,
             "alpha": 0.5},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": 0.1}},
    "system": {"speed": "lognormal"},
    "eval": {"federated": True},
    "runtime": {"name": "inprocess", "device": "cpu"},
}


def test_a_run_over_clients_built_on_demand_equals_one_over_clients_built_up_front(tmp_path):
  """The loop's clock counts from sizes and its lazily packed clients give the metrics
  of the same run over a plain dict of every client."""
  import dataclasses
  from fedsim.experiment.config.loader import load_config, plain
  from fedsim.experiment.loop import run_rounds
  from fedsim.experiment.simulation import build_simulation
  config = load_config(CONFIG)[0]
  sim = build_simulation(config)
  eager_clients = {cid: sim.data.clients[cid] for cid in sim.data.client_ids}
  assert not isinstance(sim.data.clients, dict)
  eager = dataclasses.replace(sim, data=dataclasses.replace(sim.data, clients=eager_clients))
  runs = []
  for name, s in (("lazy", sim), ("eager", eager)):
    (tmp_path / name).mkdir()
    runs.append(run_rounds(s, tmp_path / name, plain(config), progress=False).metrics)
  drop = {"round_seconds"}  # wall time
  lazy, built = ([{k: v for k, v in row.items() if k not in drop} for row in r] for r in runs)
  assert lazy == built
  assert lazy[-1]["eval_clients/num_clients"] > 0 and lazy[-1]["clients/late"] == 2


class _Counted(collections.abc.Sequence):
  """Clients that count how often each is read (as RoundClients packs on every read)."""

  def __init__(self, clients):
    self.clients, self.reads = clients, [0] * len(clients)

  def __len__(self):
    return len(self.clients)

  def __getitem__(self, i):
    self.reads[i] += 1
    return self.clients[i]


@pytest.mark.parametrize("chunk_bytes", [1, 2**26], ids=["chunk_per_client", "one_chunk"])
def test_inprocess_reads_each_lazy_client_once_and_equals_a_list(chunk_bytes):
  from fedsim.runtime import inprocess
  from tests.learning import builders
  alg = builders.algorithm("fedavg", {"client_optimizer": {"name": "sgd", "learning_rate": 0.4}},
                           builders.task_model(num_classes=2))
  process = inprocess.InProcessProcess(alg.process, "cpu", chunk_bytes=chunk_bytes)
  rng = np.random.default_rng(0)
  clients = [{"x": rng.normal(size=(n, 2, 3)).astype(np.float32),
              "y": rng.integers(0, 2, (n, 2)).astype(np.int32),
              "mask": np.ones((n, 2), np.float32)} for n in (2, 1, 3, 2)]
  state = process.initialize()
  counted = _Counted(clients)
  lazy, _ = process.next(state, counted)
  assert counted.reads == [1, 1, 1, 1]
  eager, _ = process.next(state, list(clients))
  for got, want in zip(alg.model_weights(lazy).trainable, alg.model_weights(eager).trainable):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
