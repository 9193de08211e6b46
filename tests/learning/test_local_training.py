"""Local training (pure TF, no TFF worker) against the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.learning import local_training
from tests.learning import reference


def _predict(weights, x):
  w, b = weights
  return tf.matmul(x, w) + b


def _batches(rng, steps, batch, dim, classes, pad_last=0):
  mask = np.ones((steps, batch), np.float32)
  if pad_last:
    mask[-1, batch - pad_last:] = 0.0
  return {"x": rng.normal(size=(steps, batch, dim)).astype(np.float32),
          "y": rng.integers(0, classes, (steps, batch)).astype(np.int32),
          "mask": mask}


def _train(weights, batches, lr, k=1, average=True):
  opt = tff.learning.optimizers.build_sgdm(learning_rate=lr)
  specs = tuple(tf.TensorSpec(w.shape, tf.float32) for w in weights)

  @tf.function
  def run(weights, batches):
    return local_training.train(_predict, opt, weights, opt.initialize(specs), batches,
                                accumulation_steps=k, average_accumulated=average)

  trained, _, stats = run(tuple(tf.constant(w) for w in weights),
                          {k_: tf.constant(v) for k_, v in batches.items()})
  return [t.numpy() for t in trained], stats


@pytest.mark.parametrize("k,average,pad", [(1, True, 0), (2, True, 1), (3, False, 0), (4, True, 2)])
def test_train_matches_numpy_sgd(k, average, pad):
  rng = np.random.default_rng(k)
  w0 = rng.normal(size=(4, 3)).astype(np.float32) * 0.1
  b0 = np.zeros(3, np.float32)
  batches = _batches(rng, steps=5, batch=4, dim=4, classes=3, pad_last=pad)
  (w, b), stats = _train((w0, b0), batches, lr=0.5, k=k, average=average)
  rw, rb = reference.sgd_train(w0, b0, batches, 0.5, accumulation_steps=k, average=average)
  np.testing.assert_allclose(w, rw, atol=1e-5)
  np.testing.assert_allclose(b, rb, atol=1e-5)
  assert float(stats.num_examples) == 20 - pad


def test_accumulated_average_equals_one_big_batch():
  """k batches of size b, averaged, give the update of one batch of size k*b."""
  rng = np.random.default_rng(7)
  w0 = rng.normal(size=(4, 3)).astype(np.float32) * 0.1
  b0 = rng.normal(size=3).astype(np.float32) * 0.1
  small = _batches(rng, steps=4, batch=3, dim=4, classes=3)
  big = {key: v.reshape((1, 12) + v.shape[2:]) for key, v in small.items()}
  (w_small, b_small), _ = _train((w0, b0), small, lr=0.3, k=4, average=True)
  (w_big, b_big), _ = _train((w0, b0), big, lr=0.3)
  np.testing.assert_allclose(w_small, w_big, atol=1e-6)
  np.testing.assert_allclose(b_small, b_big, atol=1e-6)


def test_empty_batches_are_skipped():
  rng = np.random.default_rng(3)
  w0 = rng.normal(size=(4, 3)).astype(np.float32)
  b0 = np.zeros(3, np.float32)
  batches = _batches(rng, steps=3, batch=2, dim=4, classes=3)
  padded = {key: np.concatenate([v, np.zeros_like(v[:2])]) for key, v in batches.items()}
  # Momentum would still move on an empty batch if it were not skipped.
  (w1, _), s1 = _train((w0, b0), batches, lr=0.1)
  (w2, _), s2 = _train((w0, b0), padded, lr=0.1)
  np.testing.assert_allclose(w1, w2, atol=1e-7)
  assert float(s1.num_examples) == float(s2.num_examples) == 6


def test_stats_are_sums_over_real_examples():
  w0 = np.zeros((2, 2), np.float32)
  b0 = np.zeros(2, np.float32)
  batches = {"x": np.ones((1, 3, 2), np.float32), "y": np.array([[0, 1, 1]], np.int32),
             "mask": np.array([[1, 1, 0]], np.float32)}
  _, stats = _train((w0, b0), batches, lr=0.1)
  np.testing.assert_allclose(float(stats.loss_sum), 2 * np.log(2), rtol=1e-6)
  assert float(stats.num_examples) == 2


def _log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_sequence_metrics_are_token_weighted():
  """TFF's / FedJAX's sequence baselines: loss and accuracy are means over real
  tokens; a sequence that is all padding is not an example."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 3, 5)).astype(np.float32)   # [batch, time, classes]
  y = np.array([[1, 2, 4], [3, 0, 0], [0, 0, 0], [2, 2, 2]], np.int32)  # 0 = pad
  mask = np.array([1, 1, 1, 0], np.float32)               # the last row is padding
  loss, stats = local_training.batch_loss(lambda w, x: x, (), tf.constant(logits),
                                          tf.constant(y), tf.constant(mask), pad_label=0)
  log_p = _log_softmax(logits.astype(np.float64))
  tokens = [(0, 0), (0, 1), (0, 2), (1, 0)]               # (example, position) of real tokens
  token_losses = [-log_p[e, t, y[e, t]] for e, t in tokens]
  hits = [logits[e, t].argmax() == y[e, t] for e, t in tokens]
  np.testing.assert_allclose(float(stats.loss_sum), sum(token_losses), rtol=1e-6)
  np.testing.assert_allclose(float(loss), np.mean(token_losses), rtol=1e-6)
  assert float(stats.correct) == sum(hits)
  assert float(stats.num_targets) == 4
  assert float(stats.num_examples) == 2                  # the all-padding row is no example
  # Not the per-example mean of per-sequence means (what fedsim computed before).
  per_sequence = [np.mean(token_losses[:3]), token_losses[3]]
  assert abs(float(loss) - np.mean(per_sequence)) > 1e-3


def _sequence_predict(weights, x):
  w, b = weights
  return tf.einsum("btd,dc->btc", x, w) + b


def test_sequence_training_follows_the_token_weighted_gradient():
  """Momentum SGD over two batches; the second is all padding tokens and is skipped."""
  rng = np.random.default_rng(4)
  w0 = rng.normal(size=(3, 4)).astype(np.float32) * 0.3
  b0 = np.zeros(4, np.float32)
  x = rng.normal(size=(2, 2, 3, 3)).astype(np.float32)        # [steps, batch, time, dim]
  y = np.array([[[1, 2, 0], [3, 0, 0]], [[0, 0, 0], [0, 0, 0]]], np.int32)
  mask = np.ones((2, 2), np.float32)
  opt = tff.learning.optimizers.build_sgdm(learning_rate=0.5, momentum=0.9)
  specs = tuple(tf.TensorSpec(w.shape, tf.float32) for w in (w0, b0))

  @tf.function
  def run(batches):
    return local_training.train(_sequence_predict, opt, (tf.constant(w0), tf.constant(b0)),
                                opt.initialize(specs), batches, pad_label=0)

  (w, b), _, stats = run({"x": tf.constant(x), "y": tf.constant(y), "mask": tf.constant(mask)})
  # NumPy: one step on the mean cross-entropy over the 3 real tokens of batch 0.
  xs = np.stack([x[0, 0, 0], x[0, 0, 1], x[0, 1, 0]]).astype(np.float64)
  ys = np.array([1, 2, 3])
  p = np.exp(_log_softmax(xs @ w0 + b0))
  p[np.arange(3), ys] -= 1.0
  grad_w, grad_b = xs.T @ p / 3, p.sum(0) / 3
  np.testing.assert_allclose(w, w0 - 0.5 * grad_w, atol=1e-6)
  np.testing.assert_allclose(b, b0 - 0.5 * grad_b, atol=1e-6)
  assert float(stats.num_examples) == 2 and float(stats.num_targets) == 3
