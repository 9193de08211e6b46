"""The benchmark workloads, each runnable on every runtime being compared."""

from __future__ import annotations

import contextlib
import tempfile
from typing import Callable
from unittest import mock

import numpy as np
import tensorflow as tf

from fedsim import runtime
from fedsim.backend import onednn
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
    # pfl-research's CIFAR-10 benchmark shape (bench/peers/, P1) without its two
    # dropout layers, which the hand-written reference does not draw: 50 clients
    # (a cohort) x 50 random 32x32x3 images, batch 10.
    "P1": ({"name": "keras", "builder": "workloads:simple_cnn"}, 50,
           "pfl's simple_cnn without dropout (1,626,442 params), 50 x 50 images 32x32x3"),
}
FORWARD = {"W2": baselines.mlp_forward, "W1": baselines.cnn_forward,
           "P1": baselines.simple_cnn_forward}
P1_CLIENTS, P1_BATCH = 50, 10


def simple_cnn(input_shape, num_classes):
  """The `keras` builder of P1: conv 3x3x32, conv 3x3x64 (valid, ReLU), 2x2 max-pool,
  dense 128 (ReLU), dense 10."""
  layers = tf.keras.layers
  return tf.keras.Sequential([
      tf.keras.Input(input_shape),
      layers.Conv2D(32, 3, activation="relu"), layers.Conv2D(64, 3, activation="relu"),
      layers.MaxPool2D(2), layers.Flatten(),
      layers.Dense(128, activation="relu"), layers.Dense(num_classes)])


def p1_data(seed, clients, examples):
  """The `custom` dataset of P1: random images and labels, the same for every runtime."""
  rng = np.random.default_rng(seed)

  def images(n):
    return (rng.normal(size=(n, 32, 32, 3)).astype(np.float32),
            rng.integers(0, 10, n).astype(np.int32))

  return {"clients": {f"u{u:03d}": images(examples) for u in range(clients)},
          "test": images(examples)}


def config(name: str, num_clients: int = 10, examples_per_client: int | None = None,
           precision: str = "float32") -> dict:
  model, examples, _ = SPECS[name]
  data = {"name": "emnist_synthetic", "num_clients": num_clients,
          "examples_per_client": examples_per_client or examples, "test_examples": 100,
          "batch_size": BATCH_SIZE, "epochs": 1}
  if name == "P1":
    data = {"name": "custom", "builder": "workloads:p1_data", "batch_size": P1_BATCH,
            "epochs": 1, "args": {"clients": P1_CLIENTS,
                                  "examples": examples_per_client or examples}}
  # bfloat16 is an inprocess setting; float32 keeps the default runtime so
  # that building the workload compiles nothing it may not use.
  runtime = ({"runtime": {"name": "inprocess", "precision": precision}}
             if precision != "float32" else {})
  return {**runtime,
      "name": f"bench-{name}", "seed": 0, "rounds": 1, "clients_per_round": 1,
      "data": data,
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
    return list(self.sim.data.client_ids[:count or (P1_CLIENTS if self.name == "P1" else 10)])

  def round_fn(self, runtime: str, count: int | None = None, pair_pools: bool = True,
               fresh: bool = False) -> Callable[[], None]:
    """A no-arg function running one round of `count` clients on `runtime`.

    `pair_pools` False builds `inprocess` and `graph_loop` without pairing their
    max-pools with oneDNN's (`fedsim.backend.onednn`): TensorFlow's draw, as before.
    `fresh` builds `inprocess` anew rather than reusing the simulation's.
    """
    ids = self.clients(count)
    if runtime == "stock_tff":
      clients = [(self.sim.data.clients[c].x, self.sim.data.clients[c].y) for c in ids]
      return baselines.stock_tff_round(self._keras_model, clients, BATCH_SIZE,
                                       CLIENT_LR, SERVER_LR)
    packed = [pack_client(self.sim, 1, cid) for cid in ids]
    if runtime == "graph_loop":
      dtype = {"float32": tf.float32, "bfloat16": tf.bfloat16}[self.precision]
      return baselines.graph_loop_round(
          FORWARD[self.name], self.sim.model.initial_weights.trainable,
          packed, CLIENT_LR, SERVER_LR, dtype, pair_pools)
    if runtime == "python_loop":
      return baselines.lower_bound_round(self._keras_model(), packed, CLIENT_LR, SERVER_LR)
    if runtime == "local":
      process = self.sim.algorithm.process
    elif runtime == "inprocess" and (fresh or not pair_pools):
      with mock.patch.object(onednn, "applies", onednn.applies if pair_pools else (
          lambda device: False)):
        process = inprocess.InProcessProcess(self.sim.algorithm.process, "auto")
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
    if self.name == "P1":
      return simple_cnn(shape, 10)
    return keras_models.cnn(shape, 10, params.filters, params.dense)
