"""The workloads' models in PyTorch, for the Flower and pfl-research runs."""

from __future__ import annotations

import torch
from torch import nn


def mlp() -> nn.Module:
  """784-200-200-10 with ReLU (McMahan et al.'s 2NN)."""
  return nn.Sequential(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
                       nn.Linear(200, 10))


def simple_cnn() -> nn.Module:
  """pfl-research's `simple_cnn` for 3x32x32 inputs: 1,626,442 parameters."""
  return nn.Sequential(
      nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
      nn.Dropout(0.25), nn.Flatten(), nn.Linear(64 * 14 * 14, 128), nn.ReLU(),
      nn.Dropout(0.5), nn.Linear(128, 10))


def build(name: str) -> nn.Module:
  return {"mlp": mlp, "simple_cnn": simple_cnn}[name]()


def to_torch(x, y):
  """NumPy (channels-last) examples as PyTorch tensors (channels-first images)."""
  xt = torch.from_numpy(x)
  if xt.dim() == 4:
    xt = xt.permute(0, 3, 1, 2).contiguous()
  return xt, torch.from_numpy(y)
