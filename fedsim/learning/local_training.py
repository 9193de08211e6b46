"""Local training of one client over packed batches (pure TensorFlow), and
the full-gradient and evaluation passes over them; the loss of one batch is
`fedsim.learning.loss`.

Client data arrives as dense tensors `x [steps, batch, ...]`, `y [steps,
batch]`, `mask [steps, batch]` rather than a tf.data pipeline: handing a
dataset to a function costs a fixed 8-30 ms per client on this stack, which
dominated round time. A batch with no target (no real example, or only
padding tokens) is skipped entirely (no optimizer step).

Gradient accumulation (Horovod's `backward_passes_per_step`): the gradients
of consecutive batches are summed into a window and applied in one optimizer
step; see `Accumulation` for what they are divided by and what happens to a
partial last window.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import tensorflow as tf

from fedsim.learning.loss import (BatchStats, Weights, add_stats, batch_gradient, batch_loss,
                                  dense_gradient, masked_loss, num_targets, target_mask,
                                  zero_stats)
from fedsim.learning.optimizers import advance_iterations


class Accumulation(NamedTuple):
  """How the gradients of consecutive batches make one optimizer step.

  `steps` backward passes (batches with a target) fill a window; its summed
  gradient is divided by `divide_by`: 'window' (the passes in it: the mean of
  the batch means), 'backward_passes' (the constant `steps`, as Horovod's
  `average_aggregated_gradients`), 'examples' (the targets it covers: the
  mean over every example in the window, exact with short batches) or 'none'
  (the sum, Horovod's default). A partial last window is applied at the end
  of local training, or with `carry` kept (as Horovod's accumulator variables
  keep it) for the client's next local training. `count_passes`: the
  optimizer's iteration count (Adam's bias correction) advances by every
  backward pass, as Horovod increments `optimizer.iterations`, not once per
  applied window.
  """

  steps: int = 1
  divide_by: str = "window"
  carry: bool = False
  count_passes: bool = False


def empty_window(weights: Weights) -> dict:
  """An accumulation window with nothing in it (see `train`)."""
  return {"grads": tuple(tf.zeros_like(w) for w in weights),
          "passes": tf.constant(0.0), "targets": tf.constant(0.0)}


class TrainResult(NamedTuple):
  weights: Weights
  optimizer_state: Any
  stats: BatchStats
  window: dict   # the partial window carried over (empty unless `carry`)
  steps: tf.Tensor  # optimizer steps applied (float32)


def train(predict: Callable, optimizer, weights: Weights, optimizer_state, batches,
          accumulation: Accumulation = Accumulation(),
          extra_gradient: Callable | None = None, pad_label: int | None = None,
          window: dict | None = None) -> TrainResult:
  """Runs local training over every batch in `batches`.

  Args:
    predict: `(weights, x) -> logits`.
    optimizer: a `tff.learning.optimizers.Optimizer`.
    weights: tuple of float tensors, the starting trainable weights.
    optimizer_state: the optimizer's state (from `optimizer.initialize`).
    batches: a mapping with `x`, `y`, `mask` tensors with a leading step axis.
    accumulation: how batch gradients make optimizer steps.
    extra_gradient: optional `weights -> gradient` added to every batch
      gradient (e.g. elastic averaging's pull toward the center model).
    pad_label: label of padding positions in sequence targets, or None.
    window: a window carried from the client's last local training
      (`{'grads', 'passes', 'targets'}`), or None for an empty one.

  Returns:
    The `TrainResult` after the last step.
  """
  weights = tuple(weights)
  num_steps = tf.shape(batches["mask"])[0]
  if window is None and accumulation.steps == 1 and not accumulation.count_passes and (
      accumulation.divide_by in ("window", "backward_passes", "none")):
    return _train_per_batch(predict, optimizer, weights, optimizer_state, batches,
                            extra_gradient, pad_label, num_steps)
  steps = float(accumulation.steps)
  by_examples = accumulation.divide_by == "examples"
  divisors = {"window": lambda w: w["passes"], "backward_passes": lambda w: steps,
              "examples": lambda w: w["targets"], "none": lambda w: 1.0}
  divisor = divisors[accumulation.divide_by]
  empty = empty_window(weights)
  # One container type through the loop, whatever the caller's mapping type.
  window = empty if window is None else {
      "grads": tuple(window["grads"]), "passes": window["passes"],
      "targets": window["targets"]}

  def step(i, weights, opt_state, window, stats, applied):
    x, y, mask = batches["x"][i], batches["y"][i], batches["mask"][i]
    has_targets = num_targets(y, mask, pad_label) > 0

    def accumulate():
      grads, batch_stats = batch_gradient(
          predict, weights, x, y, mask, extra_gradient, pad_label)
      scale = batch_stats.num_targets if by_examples else 1.0
      return ({"grads": tuple(a + scale * g for a, g in zip(window["grads"], grads)),
               "passes": window["passes"] + 1.0,
               "targets": window["targets"] + batch_stats.num_targets},
              add_stats(stats, batch_stats))

    window, stats = tf.cond(has_targets, accumulate, lambda: (window, stats))
    last = tf.equal(i, num_steps - 1)
    apply_now = tf.logical_or(
        window["passes"] >= steps,
        tf.logical_and(last, window["passes"] > 0) if not accumulation.carry else False)

    def apply():
      grads = tuple(a / divisor(window) for a in window["grads"])
      state = opt_state
      if accumulation.count_passes:
        state = advance_iterations(state, window["passes"] - 1.0)
      new_state, new_weights = optimizer.next(state, weights, grads)
      return tuple(new_weights), new_state, empty

    weights, opt_state, window = tf.cond(
        apply_now, apply, lambda: (weights, opt_state, window))
    applied += tf.cast(apply_now, tf.float32)
    return i + 1, weights, opt_state, window, stats, applied

  _, weights, optimizer_state, window, stats, applied = tf.while_loop(
      lambda i, *_: i < num_steps, step,
      (tf.constant(0), weights, optimizer_state, window, zero_stats(), tf.constant(0.0)))
  return TrainResult(weights, optimizer_state, stats, window, applied)


def _train_per_batch(predict, optimizer, weights, optimizer_state, batches, extra_gradient,
                     pad_label, num_steps) -> TrainResult:
  """`train` when each batch with a target is one optimizer step (the default).

  The same numbers as the window (a window of one pass divided by 1 is the
  batch gradient) with less per-batch work: the round's time on small models
  is mostly per-op cost, not arithmetic. The targets of every batch are
  counted once per client; when each batch has one (the usual case) the loop
  runs without a per-batch condition. Either way only loss and accuracy are
  summed per batch.
  """
  labels = tf.cast(batches["y"], tf.int32)
  real = target_mask(labels, batches["mask"], pad_label)  # [steps, batch, ...]
  step_targets = tf.reduce_sum(real, axis=list(range(1, len(real.shape))))
  example_axes = list(range(2, len(real.shape)))
  num_examples = tf.reduce_sum(
      tf.cast(tf.reduce_sum(real, axis=example_axes) > 0, tf.float32)
      if example_axes else real)

  def loop(guarded: bool):
    """The batches in order; with `guarded`, a batch without targets is skipped."""
    def step(i, weights, opt_state, loss_sum, correct):
      def update():
        grads, (batch_sum, batch_correct) = dense_gradient(
            lambda w: _split_loss(masked_loss(predict, w, batches["x"][i], labels[i],
                                              real[i], step_targets[i])),
            weights, extra_gradient)
        new_state, new_weights = optimizer.next(opt_state, weights, grads)
        return tuple(new_weights), new_state, loss_sum + batch_sum, correct + batch_correct

      if not guarded:
        return (i + 1, *update())
      return (i + 1, *tf.cond(step_targets[i] > 0, update,
                              lambda: (weights, opt_state, loss_sum, correct)))

    _, new_weights, new_state, loss_sum, correct = tf.while_loop(
        lambda i, *_: i < num_steps, step,
        (tf.constant(0), weights, optimizer_state, tf.constant(0.0), tf.constant(0.0)))
    return new_weights, new_state, loss_sum, correct

  has_targets = step_targets > 0
  weights, optimizer_state, loss_sum, correct = tf.cond(
      tf.reduce_all(has_targets), lambda: loop(guarded=False), lambda: loop(guarded=True))
  stats = BatchStats(loss_sum, correct, num_examples, tf.reduce_sum(step_targets))
  applied = tf.reduce_sum(tf.cast(has_targets, tf.float32))  # optimizer steps
  return TrainResult(weights, optimizer_state, stats, empty_window(weights), applied)


def _split_loss(masked):
  loss, loss_sum, correct = masked
  return loss, (loss_sum, correct)


def gradient(predict: Callable, weights: Weights, batches, pad_label: int | None = None):
  """Gradient of the mean loss over all targets of all batches, and the stats (FedSGD)."""
  weights = tuple(weights)
  num_steps = tf.shape(batches["mask"])[0]

  def step(i, acc, stats):
    mask = batches["mask"][i]
    grads, batch_stats = batch_gradient(
        predict, weights, batches["x"][i], batches["y"][i], mask, pad_label=pad_label)
    count = batch_stats.num_targets
    return i + 1, tuple(a + g * count for a, g in zip(acc, grads)), add_stats(stats, batch_stats)

  _, acc, stats = tf.while_loop(
      lambda i, *_: i < num_steps, step,
      (tf.constant(0), tuple(tf.zeros_like(w) for w in weights), zero_stats()))
  total = tf.maximum(stats.num_targets, 1.0)
  return tuple(a / total for a in acc), stats


def evaluate(predict: Callable, weights: Weights, batches,
             pad_label: int | None = None) -> BatchStats:
  """Loss and accuracy sums of `weights` over all batches (no training)."""
  weights = tuple(weights)
  num_steps = tf.shape(batches["mask"])[0]

  def step(i, stats):
    _, batch_stats = batch_loss(
        predict, weights, batches["x"][i], batches["y"][i], batches["mask"][i], pad_label)
    return i + 1, add_stats(stats, batch_stats)

  _, stats = tf.while_loop(lambda i, *_: i < num_steps, step, (tf.constant(0), zero_stats()))
  return stats
