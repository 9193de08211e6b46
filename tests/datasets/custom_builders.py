"""User dataset functions for test_custom.py, imported by path as a config would."""

from __future__ import annotations

import numpy as np


def centralized(seed, n=60, features=4):
  rng = np.random.default_rng(seed)
  y = np.arange(n) % 3
  x = rng.normal(size=(n, features)).astype(np.float32) + y[:, None]
  return {"train": (x, y), "test": (x[:9], y[:9])}


def per_client(seed, clients=3):
  del seed
  make = lambda k: (np.full((k + 2, 2), k, np.float32), np.full(k + 2, k))
  return {"clients": {f"user{k}": make(k) for k in range(clients)}, "test": make(1)}


def wrong(seed):
  del seed
  return [1, 2, 3]
