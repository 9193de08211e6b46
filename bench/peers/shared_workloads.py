"""The two workloads of the side-by-side and their synthetic data, NumPy only.

Every framework reads the same examples: user `u`'s are drawn from (SEED, u) alone,
inputs standard normal (as pfl's benchmark normalizes CIFAR-10 per channel), labels
the argmax of a fixed random linear map of the inputs, so that a model can learn
them and the loss falls. Images are channels-last (Keras); PyTorch code transposes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

SEED = 0
CLASSES = 10


@dataclasses.dataclass(frozen=True)
class Workload:
  name: str
  description: str
  model: str                # "mlp" (784-200-200-10) or "simple_cnn" (pfl's)
  users: int
  examples_per_user: int
  cohort: int               # clients per round
  batch_size: int
  input_shape: tuple[int, ...]
  local_epochs: int = 1
  client_lr: float = 0.1    # local SGD
  server_lr: float = 1.0    # central SGD on the averaged update: plain FedAvg


WORKLOADS = {
    "W2": Workload("W2", "MLP 784-200-200-10, 10 clients x 100 examples, batch 20, 1 epoch",
                   "mlp", users=10, examples_per_user=100, cohort=10, batch_size=20,
                   input_shape=(784,)),
    # pfl-research's CIFAR-10 benchmark (benchmarks/image_classification, baseline.yaml).
    "P1": Workload("P1", "pfl-research's CIFAR-10 shape: 1,000 users x 50 images 32x32x3, "
                   "cohort 50, batch 10, 1 epoch, pfl's simple_cnn (1,626,442 parameters)",
                   "simple_cnn", users=1000, examples_per_user=50, cohort=50, batch_size=10,
                   input_shape=(32, 32, 3)),
}


def _teacher(w: Workload) -> np.ndarray:
  size = int(np.prod(w.input_shape))
  # The user index past the last user draws the map, so no user's stream is reused.
  return np.random.default_rng([SEED, w.users]).standard_normal((size, CLASSES),
                                                                dtype=np.float32)


def user_data(w: Workload, user: int, teacher: np.ndarray | None = None):
  """User `user`'s (x float32 [n, *input_shape], y int64 [n]) of workload `w`."""
  rng = np.random.default_rng([SEED, user])
  x = rng.standard_normal((w.examples_per_user, *w.input_shape), dtype=np.float32)
  t = _teacher(w) if teacher is None else teacher
  y = np.argmax(x.reshape(len(x), -1) @ t, axis=1).astype(np.int64)
  return x, y


def all_users(w: Workload) -> list[tuple[np.ndarray, np.ndarray]]:
  """Every user's data, in user order (built once; P1 is 614 MB of float32)."""
  teacher = _teacher(w)
  return [user_data(w, u, teacher) for u in range(w.users)]
