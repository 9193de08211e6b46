"""The loss of one packed batch (pure TensorFlow): mean cross-entropy over its
targets, the sums `BatchStats` keeps, and its gradient.

A batch is `x [batch, ...]`, `y [batch]` (or `[batch, time]` for sequences)
and `mask [batch]`; padding rows carry mask 0 and add nothing to the loss
(see `fedsim.learning.local_training` for why data arrives packed).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import tensorflow as tf

Weights = Any  # a tuple of tensors (the trainable model weights)


class BatchStats(NamedTuple):
  """Sums over the real examples seen in training (at the pre-step weights).

  A target is one predicted label: an example, or one real (non-padding)
  token of a sequence. Loss and accuracy are means over targets, so sequence
  metrics are token-weighted as TFF's and FedJAX's Stack Overflow and
  Shakespeare baselines report them; an example whose targets are all
  padding is not counted.
  """

  loss_sum: tf.Tensor     # cross-entropy summed over targets
  correct: tf.Tensor      # targets predicted right
  num_examples: tf.Tensor  # examples with at least one target
  num_targets: tf.Tensor   # targets: num_examples, or real tokens of sequences


def batch_loss(predict: Callable, weights: Weights, x, y, mask, pad_label=None):
  """Mean cross-entropy over the targets of one batch, and its stats.

  Rows with mask 0 are padding. Logits may carry extra positions (sequence
  models: [batch, time, classes]); each position is then a target, except
  positions whose label is `pad_label` (padding of short sequences). The
  loss is the token-weighted mean: every real token weighs the same,
  whatever the length of its sequence.
  """
  labels = tf.cast(y, tf.int32)
  real = target_mask(labels, mask, pad_label)
  extra_axes = list(range(1, len(real.shape)))
  num_targets = tf.reduce_sum(real)
  has_target = (tf.cast(tf.reduce_sum(real, axis=extra_axes) > 0, tf.float32)
                if extra_axes else real)
  loss, loss_sum, correct = masked_loss(predict, weights, x, labels, real, num_targets)
  return loss, BatchStats(loss_sum, correct, tf.reduce_sum(has_target), num_targets)


def masked_loss(predict, weights, x, labels, real, num_targets):
  """`(mean loss, loss sum, targets predicted right)` over the targets `real` (1.0 each).

  `num_targets` is `reduce_sum(real)`, passed in so that callers can compute it
  for all batches at once.
  """
  logits = predict(weights, x)
  per_position = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
  correct_positions = tf.cast(
      tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels), tf.float32)
  loss_sum = tf.reduce_sum(per_position * real)
  return (loss_sum / tf.maximum(num_targets, 1.0), loss_sum,
          tf.reduce_sum(correct_positions * real))


def target_mask(labels, mask, pad_label):
  """1.0 where a label is a target: a real row and, in sequences, not padding.

  `mask` has the leading axes of `labels` (batch, or steps and batch); labels
  may have more (sequence positions).
  """
  real = tf.cast(mask, tf.float32)
  for _ in range(len(labels.shape) - len(mask.shape)):
    real = real[..., None]
  real = real * tf.ones_like(labels, tf.float32)
  if pad_label is not None and len(labels.shape) > len(mask.shape):
    real = real * tf.cast(tf.not_equal(labels, pad_label), tf.float32)
  return real


def num_targets(y, mask, pad_label=None):
  """Targets in one batch (see `BatchStats`), without running the model."""
  return tf.reduce_sum(target_mask(tf.cast(y, tf.int32), mask, pad_label))


def zero_stats() -> BatchStats:
  return BatchStats(*(tf.constant(0.0) for _ in BatchStats._fields))


def add_stats(a: BatchStats, b: BatchStats) -> BatchStats:
  return BatchStats(*(u + v for u, v in zip(a, b)))


def batch_gradient(predict, weights, x, y, mask, extra_gradient=None, pad_label=None):
  """Gradient of the batch's mean loss w.r.t. `weights` (+ `extra_gradient(weights)`)."""
  return dense_gradient(lambda w: batch_loss(predict, w, x, y, mask, pad_label), weights,
                        extra_gradient)


def dense_gradient(loss_fn, weights, extra_gradient):
  """`(gradient of loss, aux)` for `loss_fn(weights) -> (loss, aux)`, dense, + extra."""
  with tf.GradientTape() as tape:
    tape.watch(weights)
    loss, stats = loss_fn(weights)
  grads = tape.gradient(loss, weights)
  # Dense: an embedding's gradient arrives as IndexedSlices, which windows and
  # optimizers would have to special-case.
  grads = tuple(tf.zeros_like(w) if g is None else tf.convert_to_tensor(g)
                for g, w in zip(grads, weights))
  if extra_gradient is not None:
    grads = tuple(g + e for g, e in zip(grads, extra_gradient(weights)))
  return grads, stats
