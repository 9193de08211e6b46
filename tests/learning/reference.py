"""NumPy references for exact-number tests, written from the papers and seeds.

Nothing here follows fedsim's code: the optimizers are TensorFlow's documented
update rules (`tf.compat.v1.train.MomentumOptimizer`, Keras `Adam`, `RMSprop` and
`Adagrad`), local
gradient accumulation is a line-by-line transcription of Horovod's
`LocalGradientAggregationHelper` (counter, accumulator variables, the apply
condition and the `optimizer.iterations` increments), and "the mean over the
examples of a window" is computed on the window's examples put together.
Batches are dicts of x [steps, batch, d], y [steps, batch], mask [steps, batch];
the model is softmax regression, params = [w, b].
"""

from __future__ import annotations

import numpy as np


def softmax(z):
  z = z - z.max(axis=-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis=-1, keepdims=True)


def mean_grad(params, x, y):
  """Gradient of the mean cross-entropy of softmax regression over examples (x, y)."""
  w, b = params
  p = softmax(x @ w + b)
  p[np.arange(len(y)), y] -= 1.0
  p /= len(y)
  return [x.T @ p, p.sum(axis=0)]


def batch_grad(w, b, x, y, mask):
  """Gradient of the mean cross-entropy over the real (mask 1) examples of a batch."""
  real = mask > 0
  return mean_grad([w, b], x[real], y[real])


def mean_loss(w, b, x, y):
  p = softmax(x @ w + b)
  return float(-np.log(p[np.arange(len(y)), y]).mean())


def real_batches(batches):
  """The (x, y) of each batch that holds a real example, in order."""
  out = []
  for x, y, mask in zip(batches["x"], batches["y"], batches["mask"]):
    if mask.sum() > 0:
      out.append((x[mask > 0], y[mask > 0]))
  return out


class Sgd:
  """Plain SGD: var -= lr * g."""

  def __init__(self, lr):
    self.lr, self.iterations = lr, 0

  def apply(self, params, grads):
    self.iterations += 1
    return [p - self.lr * g for p, g in zip(params, grads)]


class Momentum:
  """`tf.compat.v1.train.MomentumOptimizer`: accum = m * accum + g; var -= lr * accum."""

  def __init__(self, lr, momentum):
    self.lr, self.momentum, self.accum, self.iterations = lr, momentum, None, 0

  def apply(self, params, grads):
    if self.accum is None:
      self.accum = [np.zeros_like(p) for p in params]
    self.iterations += 1
    self.accum = [self.momentum * a + g for a, g in zip(self.accum, grads)]
    return [p - self.lr * a for p, a in zip(params, self.accum)]


class Adam:
  """Keras `Adam` (Kingma & Ba's algorithm with epsilon-hat): t = iterations + 1,
  lr_t = lr sqrt(1 - b2^t) / (1 - b1^t), m = b1 m + (1 - b1) g,
  v = b2 v + (1 - b2) g^2, var -= lr_t m / (sqrt(v) + eps)."""

  def __init__(self, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    self.lr, self.b1, self.b2, self.eps = lr, beta_1, beta_2, epsilon
    self.m = self.v = None
    self.iterations = 0

  def apply(self, params, grads):
    if self.m is None:
      self.m = [np.zeros_like(p) for p in params]
      self.v = [np.zeros_like(p) for p in params]
    t = self.iterations + 1
    lr_t = self.lr * np.sqrt(1 - self.b2 ** t) / (1 - self.b1 ** t)
    self.m = [self.b1 * m + (1 - self.b1) * g for m, g in zip(self.m, grads)]
    self.v = [self.b2 * v + (1 - self.b2) * g * g for v, g in zip(self.v, grads)]
    self.iterations += 1
    return [p - lr_t * m / (np.sqrt(v) + self.eps) for p, m, v in zip(params, self.m, self.v)]


class RmsProp:
  """RMSProp (Hinton's lecture 6e), as Keras writes it: ms = d ms + (1 - d) g^2,
  from ms = 0; var -= lr g / (sqrt(ms) + eps)."""

  def __init__(self, lr, decay=0.9, epsilon=1e-7):
    self.lr, self.decay, self.eps, self.ms, self.iterations = lr, decay, epsilon, None, 0

  def apply(self, params, grads):
    if self.ms is None:
      self.ms = [np.zeros_like(p) for p in params]
    self.iterations += 1
    self.ms = [self.decay * s + (1 - self.decay) * g * g for s, g in zip(self.ms, grads)]
    return [p - self.lr * g / (np.sqrt(s) + self.eps) for p, g, s in zip(params, grads, self.ms)]


class Adagrad:
  """Adagrad (Duchi, Hazan and Singer 2011), as Keras writes it: acc += g^2, from
  acc = initial_accumulator_value; var -= lr g / (sqrt(acc) + eps)."""

  def __init__(self, lr, initial_accumulator_value=0.1, epsilon=1e-7):
    self.lr, self.initial, self.eps = lr, initial_accumulator_value, epsilon
    self.acc, self.iterations = None, 0

  def apply(self, params, grads):
    if self.acc is None:
      self.acc = [np.full_like(p, self.initial) for p in params]
    self.iterations += 1
    self.acc = [a + g * g for a, g in zip(self.acc, grads)]
    return [p - self.lr * g / (np.sqrt(a) + self.eps) for p, g, a in zip(params, grads, self.acc)]


class HorovodAggregation:
  """Horovod's `LocalGradientAggregationHelper` on one worker (allreduce = identity).

  compute_gradients: clear the accumulator when the counter is 0, add the
  gradient, counter += 1; when the counter reaches backward_passes_per_step,
  read the accumulator, reset the counter to 0 and divide by
  backward_passes_per_step if average_aggregated_gradients.
  apply_gradients: when the counter is 0 the optimizer applies them, else
  `optimizer.iterations` += 1. The counter and accumulator are variables: they
  persist between training calls.
  """

  def __init__(self, backward_passes_per_step, average_aggregated_gradients):
    self.k, self.average = backward_passes_per_step, average_aggregated_gradients
    self.counter, self.accum = 0, None

  def step(self, optimizer, params, grads):
    if self.counter == 0 or self.accum is None:
      self.accum = [np.zeros_like(g) for g in grads]
    self.accum = [a + g for a, g in zip(self.accum, grads)]
    self.counter += 1
    if self.counter == self.k:
      reduced = [a / (self.k if self.average else 1) for a in self.accum]
      self.counter = 0
      return optimizer.apply(params, reduced)
    optimizer.iterations += 1
    return params


def horovod_train(params, batches, optimizer, helper, extra_gradient=None):
  """Local training through Horovod's helper (the partial window stays in it)."""
  for x, y in real_batches(batches):
    grads = mean_grad(params, x, y)
    if extra_gradient is not None:
      grads = [g + e for g, e in zip(grads, extra_gradient(params))]
    params = helper.step(optimizer, params, grads)
  return params


def windows_train(params, batches, optimizer, k, divide_by, count_passes=False):
  """fedsim's accumulation options from their definitions; a partial last window
  is applied (flush). window: mean of the window's batch means; examples: the
  mean over the window's examples put together; backward_passes: sum / k;
  none: the sum. count_passes: the optimizer's iterations also count the
  passes that did not apply (Horovod's counting)."""
  real = real_batches(batches)
  for start in range(0, len(real), k):
    window = real[start:start + k]
    batch_means = [mean_grad(params, x, y) for x, y in window]
    if divide_by == "examples":
      xs = np.concatenate([x for x, _ in window])
      ys = np.concatenate([y for _, y in window])
      grads = mean_grad(params, xs, ys)
    else:
      divisor = {"window": len(window), "backward_passes": k, "none": 1}[divide_by]
      grads = [sum(parts) / divisor for parts in zip(*batch_means)]
    if count_passes:
      optimizer.iterations += len(window) - 1
    params = optimizer.apply(params, grads)
  return params


def local_sgd(w, b, batches, lr, optimizer=None):
  """McMahan et al.'s ClientUpdate: one step per batch with a real example."""
  optimizer = optimizer or Sgd(lr)
  params = [w.copy(), b.copy()]
  for x, y in real_batches(batches):
    params = optimizer.apply(params, mean_grad(params, x, y))
  return params
