"""fedsim on a workload as a user runs it: `fedsim.run` on a config with `runtime: inprocess`.

    uv run python bench/peers/fedsim_run.py W2 --rounds 20

Rounds are timed from the run's own `on_round` callback, which fedsim calls after a
round is logged and checkpointed (what a user waits for); fedsim's `round_seconds`
(its compiled round alone) comes along. fedsim evaluates after its last round (and
checkpoints there), so the run plays one round more than asked and that round is
not reported: no evaluation falls inside the reported rounds.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import protocol  # noqa: E402  (bench/peers/)
import shared_workloads as sw  # noqa: E402


def simple_cnn(input_shape, num_classes):
  """pfl-research's `simple_cnn` in Keras (1,626,442 parameters on 32x32x3)."""
  import tensorflow as tf
  layers = tf.keras.layers
  return tf.keras.Sequential([
      tf.keras.Input(input_shape),
      layers.Conv2D(32, 3, activation="relu"), layers.Conv2D(64, 3, activation="relu"),
      layers.MaxPool2D(2), layers.Dropout(0.25), layers.Flatten(),
      layers.Dense(128, activation="relu"), layers.Dropout(0.5), layers.Dense(num_classes)])


def config(w: sw.Workload, rounds: int) -> dict:
  model = ({"name": "mlp", "hidden": [200, 200]} if w.model == "mlp" else
           {"name": "keras", "builder": "fedsim_run:simple_cnn"})
  return {
      "name": f"peers-{w.name}", "seed": sw.SEED, "rounds": rounds + 1,
      "clients_per_round": w.cohort,
      "data": {"name": "custom", "builder": "fedsim_run:load", "args": {"workload": w.name},
               "batch_size": w.batch_size, "epochs": w.local_epochs},
      "model": model,
      "algorithm": {"name": "fedavg",
                    "client_optimizer": {"name": "sgd", "learning_rate": w.client_lr},
                    "server_optimizer": {"name": "sgd", "learning_rate": w.server_lr}},
      "eval": {"every": rounds + 1},
      "runtime": {"name": "inprocess"},
  }


def load(seed, workload):
  """The `custom` dataset: every user's examples, the same for every framework."""
  del seed  # the examples follow shared_workloads.SEED, whatever the run's seed
  users = sw.all_users(sw.WORKLOADS[workload])
  test = users[0]  # evaluated once, after the reported rounds
  return {"clients": {f"u{u:04d}": (x, y.astype(np.int32)) for u, (x, y) in enumerate(users)},
          "test": (test[0], test[1].astype(np.int32))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workload", choices=sorted(sw.WORKLOADS))
  parser.add_argument("--rounds", type=int, default=20)
  args = parser.parse_args()
  w = sw.WORKLOADS[args.workload]
  import fedsim

  def on_round(round_num, metrics, info):
    del info
    if round_num <= args.rounds:
      protocol.emit(round=round_num, t=time.time(), loss=float(metrics["train/loss"]),
                    round_seconds=float(metrics["round_seconds"]))

  with tempfile.TemporaryDirectory() as logdir:
    fedsim.run(config(w, args.rounds), logdir=logdir, progress=False, on_round=on_round)


if __name__ == "__main__":
  main()
