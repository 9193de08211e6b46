"""Local training (pure TF, no TFF worker) against the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.learning import local_training
from fedsim.learning.loss import batch_loss
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


def _train(weights, batches, optimizer, window=None, **accumulation):
  """Runs `local_training.train` in a tf.function; returns (weights, stats, window)."""
  specs = tuple(tf.TensorSpec(w.shape, tf.float32) for w in weights)
  options = local_training.Accumulation(**accumulation)

  @tf.function
  def run(weights, batches, window):
    return local_training.train(_predict, optimizer, weights, optimizer.initialize(specs),
                                batches, options, window=window)

  result = run(tuple(tf.constant(w) for w in weights),
               {k_: tf.constant(v) for k_, v in batches.items()}, window)
  return [t.numpy() for t in result.weights], result.stats, result.window


SGD = lambda: (tff.learning.optimizers.build_sgdm(0.5), reference.Sgd(0.5))  # noqa: E731
MOMENTUM = lambda: (tff.learning.optimizers.build_sgdm(0.5, momentum=0.9),  # noqa: E731
                    reference.Momentum(0.5, 0.9))
ADAM = lambda: (tff.learning.optimizers.build_adam(0.05), reference.Adam(0.05))  # noqa: E731


def _start(rng):
  return (rng.normal(size=(4, 3)).astype(np.float32) * 0.1,
          rng.normal(size=3).astype(np.float32) * 0.1)


@pytest.mark.parametrize("optimizers", [SGD, MOMENTUM, ADAM])
@pytest.mark.parametrize("k,divide_by,pad", [
    (1, "window", 0), (2, "window", 1), (3, "none", 0), (4, "window", 2),
    (2, "examples", 3), (3, "examples", 1), (3, "backward_passes", 2)])
def test_accumulation_options_match_their_definitions(optimizers, k, divide_by, pad):
  rng = np.random.default_rng(k)
  w0, b0 = _start(rng)
  batches = _batches(rng, steps=5, batch=4, dim=4, classes=3, pad_last=pad)
  ours, theirs = optimizers()
  (w, b), stats, _ = _train((w0, b0), batches, ours, steps=k, divide_by=divide_by)
  rw, rb = reference.windows_train([w0, b0], batches, theirs, k, divide_by)
  np.testing.assert_allclose(w, rw, atol=1e-5)
  np.testing.assert_allclose(b, rb, atol=1e-5)
  assert float(stats.num_examples) == 20 - pad


@pytest.mark.parametrize("name, params, theirs", [
    ("rmsprop", {"learning_rate": 0.05, "decay": 0.8}, lambda: reference.RmsProp(0.05, 0.8)),
    ("adagrad", {"learning_rate": 0.3, "initial_accumulator_value": 0.2},
     lambda: reference.Adagrad(0.3, 0.2)),
])
def test_the_configs_other_optimizers_follow_their_update_rules(name, params, theirs):
  """`client_optimizer: {name: rmsprop}` and `adagrad`, as a config builds them,
  over windows of 2 batches."""
  from fedsim.learning.optimizers import OPTIMIZERS, build_optimizer
  from fedsim.config.typed import Component
  ours = build_optimizer(Component(name, OPTIMIZERS.get(name).params(**params)))
  rng = np.random.default_rng(3)
  w0, b0 = _start(rng)
  batches = _batches(rng, steps=5, batch=4, dim=4, classes=3, pad_last=1)
  (w, b), _, _ = _train((w0, b0), batches, ours, steps=2, divide_by="window")
  rw, rb = reference.windows_train([w0, b0], batches, theirs(), 2, "window")
  np.testing.assert_allclose(w, rw, atol=1e-5)
  np.testing.assert_allclose(b, rb, atol=1e-5)
  assert np.abs(w - w0).max() > 1e-2


@pytest.mark.parametrize("average,divide_by", [(True, "backward_passes"), (False, "none")])
def test_horovod_accumulation_with_adam_matches_its_helper(average, divide_by):
  """Horovod's semantics: constant divisor, passes counted as iterations."""
  rng = np.random.default_rng(11)
  w0, b0 = _start(rng)
  batches = _batches(rng, steps=6, batch=4, dim=4, classes=3)
  ours, theirs = ADAM()
  (w, b), _, _ = _train((w0, b0), batches, ours, steps=3, divide_by=divide_by,
                        count_passes=True)
  rw, rb = reference.horovod_train([w0, b0], batches, theirs,
                                   reference.HorovodAggregation(3, average))
  np.testing.assert_allclose(w, rw, atol=1e-6)
  np.testing.assert_allclose(b, rb, atol=1e-6)
  # Counting only applies changes Adam's bias correction, so the option matters.
  (w_applies, _), _, _ = _train((w0, b0), batches, ADAM()[0], steps=3, divide_by=divide_by)
  assert np.abs(w_applies - rw).max() > 1e-3


def test_carried_window_is_completed_in_the_next_call():
  """remainder: carry keeps Horovod's accumulator and counter across training calls."""
  rng = np.random.default_rng(5)
  w0, b0 = _start(rng)
  first = _batches(rng, steps=5, batch=3, dim=4, classes=3, pad_last=1)
  second = _batches(rng, steps=2, batch=3, dim=4, classes=3)
  options = dict(steps=3, divide_by="backward_passes", carry=True, count_passes=True)
  ours = tff.learning.optimizers.build_sgdm(0.5, momentum=0.9)
  (w1, b1), _, window = _train((w0, b0), first, ours, **options)
  assert float(window["passes"]) == 2 and float(window["targets"]) == 3 + 2
  (w2, b2), _, window = _train((w1, b1), second, ours, window=window, **options)
  assert float(window["passes"]) == 1
  helper, theirs = reference.HorovodAggregation(3, True), reference.Momentum(0.5, 0.9)
  r1 = reference.horovod_train([w0, b0], first, theirs, helper)
  np.testing.assert_allclose(w1, r1[0], atol=1e-6)
  theirs = reference.Momentum(0.5, 0.9)  # each call starts its optimizer afresh here
  r2 = reference.horovod_train(r1, second, theirs, helper)
  np.testing.assert_allclose(w2, r2[0], atol=1e-6)
  np.testing.assert_allclose(b2, r2[1], atol=1e-6)


@pytest.mark.parametrize("size", [23, 31, 17, 38, 40])
def test_example_weighted_window_equals_one_batch_with_a_short_last_batch(size):
  """Batches of 10 (the last one short), 4 per step: `examples` makes each client's
  window exactly one batch of all its examples; `window` (mean of batch means) does not."""
  rng = np.random.default_rng(size)
  w0, b0 = rng.normal(size=(8, 5)).astype(np.float32), np.zeros(5, np.float32)
  x = rng.normal(size=(size, 8)).astype(np.float32)
  y = rng.integers(0, 5, size).astype(np.int32)
  steps = -(-size // 10)
  pad = steps * 10 - size
  small = {"x": np.concatenate([x, np.zeros((pad, 8), np.float32)]).reshape(steps, 10, 8),
           "y": np.concatenate([y, np.zeros(pad, np.int32)]).reshape(steps, 10),
           "mask": (np.arange(steps * 10) < size).astype(np.float32).reshape(steps, 10)}
  big = {"x": x[None], "y": y[None], "mask": np.ones((1, size), np.float32)}
  sgd = tff.learning.optimizers.build_sgdm(1.0)
  (w_examples, b_examples), _, _ = _train((w0, b0), small, sgd, steps=4, divide_by="examples")
  (w_window, _), _, _ = _train((w0, b0), small, sgd, steps=4, divide_by="window")
  (w_big, b_big), _, _ = _train((w0, b0), big, sgd)
  np.testing.assert_allclose(w_examples, w_big, atol=1e-6)
  np.testing.assert_allclose(b_examples, b_big, atol=1e-6)
  if size % 10:  # a short last batch: the mean of batch means weighs it too much
    assert np.abs(w_window - w_big).max() > 1e-3
  else:          # full batches: both are the mean over all examples
    np.testing.assert_allclose(w_window, w_big, atol=1e-6)


@pytest.mark.parametrize("k", [1, 2])
def test_empty_batches_are_skipped(k):
  """With momentum an applied empty batch would still move the weights, and with
  k = 2 a counted one would close a window early: neither may happen."""
  rng = np.random.default_rng(3)
  w0, b0 = _start(rng)
  batches = _batches(rng, steps=5, batch=2, dim=4, classes=3)
  for key in batches:
    batches[key][[1, 3, 4]] = 0  # real, empty, real, empty, empty
  ours, theirs = MOMENTUM()
  (w, b), stats, _ = _train((w0, b0), batches, ours, steps=k)
  rw, rb = reference.windows_train([w0, b0], batches, theirs, k, "window")
  np.testing.assert_allclose(w, rw, atol=1e-6)
  np.testing.assert_allclose(b, rb, atol=1e-6)
  assert float(stats.num_examples) == 4


def test_stats_are_sums_over_real_examples():
  w0 = np.zeros((2, 2), np.float32)
  b0 = np.zeros(2, np.float32)
  batches = {"x": np.ones((1, 3, 2), np.float32), "y": np.array([[0, 1, 1]], np.int32),
             "mask": np.array([[1, 1, 0]], np.float32)}
  _, stats, _ = _train((w0, b0), batches, tff.learning.optimizers.build_sgdm(0.1))
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
  loss, stats = batch_loss(lambda w, x: x, (), tf.constant(logits), tf.constant(y),
                           tf.constant(mask), pad_label=0)
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

  (w, b), _, stats, _, steps = run({"x": tf.constant(x), "y": tf.constant(y),
                            "mask": tf.constant(mask)})
  # NumPy: one step on the mean cross-entropy over the 3 real tokens of batch 0.
  xs = np.stack([x[0, 0, 0], x[0, 0, 1], x[0, 1, 0]]).astype(np.float64)
  ys = np.array([1, 2, 3])
  p = np.exp(_log_softmax(xs @ w0 + b0))
  p[np.arange(3), ys] -= 1.0
  grad_w, grad_b = xs.T @ p / 3, p.sum(0) / 3
  np.testing.assert_allclose(w, w0 - 0.5 * grad_w, atol=1e-6)
  np.testing.assert_allclose(b, b0 - 0.5 * grad_b, atol=1e-6)
  assert float(stats.num_examples) == 2 and float(stats.num_targets) == 3
  assert float(steps) == 1
