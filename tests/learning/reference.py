"""NumPy reference of softmax regression training, for exact-number tests."""

from __future__ import annotations

import numpy as np


def softmax(z):
  z = z - z.max(axis=-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis=-1, keepdims=True)


def batch_grad(w, b, x, y, mask):
  """Gradient of the mean cross-entropy over the real examples of a batch."""
  n = max(mask.sum(), 1.0)
  p = softmax(x @ w + b)
  p[np.arange(len(y)), y] -= 1.0
  p *= mask[:, None] / n
  return x.T @ p, p.sum(axis=0)


def mean_loss(w, b, x, y):
  p = softmax(x @ w + b)
  return float(-np.log(p[np.arange(len(y)), y]).mean())


def sgd_train(w, b, batches, lr, accumulation_steps=1, average=True):
  """Local SGD over `batches` (dict of x [S,B,d], y, mask) with accumulation."""
  w, b = w.copy(), b.copy()
  gw, gb, count = np.zeros_like(w), np.zeros_like(b), 0
  steps = len(batches["mask"])
  for i in range(steps):
    dw, db = batch_grad(w, b, batches["x"][i], batches["y"][i], batches["mask"][i])
    gw, gb, count = gw + dw, gb + db, count + 1
    if (i + 1) % accumulation_steps == 0 or i == steps - 1:
      scale = 1.0 / count if average else 1.0
      w, b = w - lr * gw * scale, b - lr * gb * scale
      gw, gb, count = np.zeros_like(w), np.zeros_like(b), 0
  return w, b
