"""The benchmark workloads, each runnable on every runtime being compared."""

from __future__ import annotations

import contextlib
import tempfile
from typing import Callable

import tensorflow as tf

from fedsim import runtime
from fedsim.runtime.session import session

runtime.install_guard()  # before any computation: never TFF's own worker

import baselines  # noqa: E402  (bench/baselines.py)
from fedsim.experiment.config.loader import load_config  # noqa: E402
from fedsim.experiment.round_clients import pack_client  # noqa: E402
from fedsim.experiment.simulation import build_simulation  # noqa: E402
from fedsim.models import keras_models  # noqa: E402
from fedsim.runtime import inprocess  # noqa: E402

CLIENT_LR, SERVER_LR, BATCH_SIZE = 0.1, 1.0, 20
SPECS = {
    "W2": ({"name": "mlp", "hidden": [200, 200]}, 100, "mlp 784-200-200-10, 10 x 100 examples"),
    "W1": ({"name": "cnn"}, 200, "cnn (1,663,370 params), 10 x 200 examples"),
}


def config(name: str, num_clients: int = 10, examples_per_client: int | None = None,
           precision: str = "float32") -> dict:
  model, examples, _ = SPECS[name]
  # bfloat16 is an inprocess setting; float32 keeps the default runtime so
  # that building the workload compiles nothing it may not use.
  runtime = ({"runtime": {"name": "inprocess", "precision": precision}}
             if precision != "float32" else {})
  return {**runtime,
      "name": f"bench-{name}", "seed": 0, "rounds": 1, "clients_per_round": 1,
      "data": {"name": "emnist_synthetic", "num_clients": num_clients,
               "examples_per_client": examples_per_client or examples, "test_examples": 100,
               "batch_size": BATCH_SIZE, "epochs": 1},
      "model": model,
      "algorithm": {"name": "fedavg",
                    "client_optimizer": {"name": "sgd", "learning_rate": CLIENT_LR},
                    "server_optimizer": {"name": "sgd", "learning_rate": SERVER_LR}},
  }


@contextlib.contextmanager
def tff_session():
  """A fedsim-owned TFF worker for stock TFF and `local` (never TFF's own)."""
  with tempfile.TemporaryDirectory() as tmp, session(f"{tmp}/worker.log"):
    yield


class Workload:
  """One workload's simulation, packed clients and round functions."""

  def __init__(self, name: str, num_clients: int = 10, precision: str = "float32"):
    self.name = name
    self.description = SPECS[name][2]
    self.precision = precision
    cfg, _ = load_config(config(name, num_clients, precision=precision))
    self.sim = build_simulation(cfg)
    self._inprocess = (self.sim.round_process
                       if isinstance(self.sim.round_process, inprocess.InProcessProcess) else None)

  def train_flops_per_round(self, count: int | None = None) -> float:
    """Analytic FLOPs of one round's local training (see `baselines.training_flops`)."""
    examples = sum(int(self.sim.data.clients[c].y.shape[0]) for c in self.clients(count))
    return examples * baselines.training_flops(self._keras_model())

  def clients(self, count: int | None = None) -> list[str]:
    return list(self.sim.data.client_ids[:count or 10])

  def round_fn(self, runtime: str, count: int | None = None) -> Callable[[], None]:
    """A no-arg function running one round of `count` clients on `runtime`."""
    ids = self.clients(count)
    if runtime == "stock_tff":
      clients = [(self.sim.data.clients[c].x, self.sim.data.clients[c].y) for c in ids]
      return baselines.stock_tff_round(self._keras_model, clients, BATCH_SIZE,
                                       CLIENT_LR, SERVER_LR)
    packed = [pack_client(self.sim, 1, cid) for cid in ids]
    if runtime == "graph_loop":
      dtype = {"float32": tf.float32, "bfloat16": tf.bfloat16}[self.precision]
      return baselines.graph_loop_round(
          baselines.FORWARD[self.sim.config.model.name], self.sim.model.initial_weights.trainable,
          packed, CLIENT_LR, SERVER_LR, dtype)
    if runtime == "python_loop":
      return baselines.lower_bound_round(self._keras_model(), packed, CLIENT_LR, SERVER_LR)
    if runtime == "local":
      process = self.sim.algorithm.process
    elif runtime == "inprocess":
      if self._inprocess is None:
        self._inprocess = inprocess.InProcessProcess(self.sim.algorithm.process, "auto")
      process = self._inprocess
    else:
      raise ValueError(f"unknown runtime {runtime}")
    state = [process.initialize()]

    def run_round():
      state[0], _ = process.next(state[0], packed)

    return run_round

  def _keras_model(self):
    params = self.sim.config.model.params
    shape = self.sim.data.input_shape
    if self.sim.config.model.name == "mlp":
      return keras_models.mlp(shape, 10, params.hidden, params.activation)
    return keras_models.cnn(shape, 10, params.filters, params.dense)
