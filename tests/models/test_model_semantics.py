"""What a user's Keras model computes under fedsim, against NumPy references:
a final softmax is trained through once, evaluation runs without dropout, and
weights go to .npz and back (into fedsim and into Keras) in Keras order."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from fedsim.config.typed import Component, parse
from fedsim.data.federated import Examples, FederatedData
from fedsim.errors import UserError
from fedsim.experiment.server_eval import make_evaluator
from fedsim.learning.loss import batch_gradient, batch_loss
from fedsim.models import MODELS
from fedsim.models.functional import build_task_model
from fedsim.state.model_export import export_model
from tests.models import keras_builders

B = "tests.models.keras_builders"
RNG = np.random.default_rng(7)
X = RNG.standard_normal((5, 3)).astype(np.float32)
Y = np.array([0, 2, 1, 2, 0], np.int32)
MASK = np.array([1, 1, 1, 1, 0], np.float32)  # the last row is padding


def keras_model(builder, seed=0, initial_weights=None, input_shape=(3,), **args):
  data = {"builder": f"{B}:{builder}", "args": args}
  if initial_weights is not None:
    data["initial_weights"] = str(initial_weights)
  spec = Component("keras", parse(MODELS.get("keras").params, data, "model"))
  return build_task_model(spec, input_shape, 3, seed=seed)


def in_graph(fn, *args):
  """`fn(*args)` evaluated in a fresh graph (TFF's functional models trace only there)."""
  with tf.Graph().as_default():
    out = fn(*tf.nest.map_structure(tf.constant, args))
    with tf.compat.v1.Session() as session:
      return session.run(out)


def weights(model):
  return tuple(np.array(w) for w in model.initial_weights.trainable)


def np_softmax(z):
  e = np.exp(z - z.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def np_loss_and_gradients(w, b, x, y, mask):
  """Mean cross-entropy of softmax(x w + b) over the real rows, and d/dw, d/db."""
  p = np_softmax(x.astype(np.float64) @ w + b)
  onehot = np.eye(w.shape[1])[y]
  n = mask.sum()
  loss = -(np.log(p[np.arange(len(y)), y]) * mask).sum() / n
  delta = (p - onehot) * mask[:, None] / n
  return loss, x.T @ delta, delta.sum(axis=0)


@pytest.mark.parametrize("builder, args", [
    ("dense", {"softmax": "dense"}),
    ("dense", {"softmax": "activation"}),
    ("dense", {"softmax": "layer"}),
    ("functional_softmax", {}),
])
def test_final_softmax_is_applied_once(builder, args):
  with_softmax = keras_model(builder, **args)
  logits_model = keras_model("dense")
  w, b = weights(with_softmax)

  def loss_and_gradients(model):
    def fn(weights, x, y, mask):
      loss, _ = batch_loss(model.predict, weights, x, y, mask)
      grads, _ = batch_gradient(model.predict, weights, x, y, mask)
      return loss, grads
    return in_graph(fn, (w, b), X, Y, MASK)

  loss, (grad_w, grad_b) = loss_and_gradients(with_softmax)
  want_loss, want_w, want_b = np_loss_and_gradients(w, b, X, Y, MASK)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  np.testing.assert_allclose(grad_w, want_w, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(grad_b, want_b, rtol=1e-4, atol=1e-6)
  # The same model without its softmax, at the same weights, trains identically.
  same_loss, (same_w, same_b) = loss_and_gradients(logits_model)
  np.testing.assert_allclose(same_loss, loss, rtol=1e-6)
  np.testing.assert_allclose(same_w, grad_w, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(same_b, grad_b, rtol=1e-6, atol=1e-7)


def np_forward(w1, b1, w2, b2, x):
  return np.maximum(x @ w1 + b1, 0.0) @ w2 + b2


def test_evaluation_runs_without_dropout():
  model = keras_model("dense", hidden=16, dropout=0.5)
  ws = weights(model)
  evaluated = in_graph(lambda w, x: [model.evaluate_predict(w, x) for _ in range(3)], ws, X)
  trained = in_graph(lambda w, x: model.predict(w, x), ws, X)
  want = np_forward(*ws, X)
  for logits in evaluated:
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-6)
  assert np.abs(trained - want).max() > 1e-3  # training keeps dropout on


def test_server_evaluation_is_deterministic_and_dropout_free(tff_runtime):
  model = keras_model("dense", hidden=16, dropout=0.5)
  data = FederatedData(clients={"c0": Examples(X, Y)}, test=Examples(X, Y),
                       input_shape=(3,), num_classes=3)
  evaluate = make_evaluator(model, data, batch_size=2)
  first, second = evaluate(model.initial_weights), evaluate(model.initial_weights)
  assert first == second
  logits = np_forward(*weights(model), X)
  p = np_softmax(logits.astype(np.float64))
  assert first["eval/loss"] == pytest.approx(-np.log(p[np.arange(5), Y]).mean(), rel=1e-5)
  assert first["eval/accuracy"] == pytest.approx((logits.argmax(1) == Y).mean())


def test_final_model_npz_round_trips_into_fedsim_and_keras(tmp_path):
  trained = keras_model("dense", seed=0, hidden=4, softmax="layer")
  path = tmp_path / "final_model.npz"
  export_model(path, trained.initial_weights, trained.weight_names)
  with np.load(path) as f:
    assert f.files == list(trained.weight_names)
    assert [k.split("/")[-1] for k in f.files] == ["kernel", "bias", "kernel", "bias"]
    arrays = [f[k] for k in f.files]
  for got, want in zip(arrays, weights(trained)):
    np.testing.assert_array_equal(got, want)

  fresh = keras_model("dense", seed=1, hidden=4, softmax="layer")
  restarted = keras_model("dense", seed=1, hidden=4, softmax="layer", initial_weights=path)
  assert not np.array_equal(weights(fresh)[0], arrays[0])  # seed 1 alone differs
  for got, want in zip(weights(restarted), arrays):
    np.testing.assert_array_equal(got, want)

  # The recipe of docs/guides/own-model.md: the builder's own Keras model takes the file as is.
  keras = keras_builders.dense((3,), 3, hidden=4, softmax="layer")
  keras.set_weights(arrays)
  np.testing.assert_allclose(keras(X, training=False).numpy(),
                             np_softmax(np_forward(*arrays, X)), rtol=1e-5, atol=1e-6)


def test_weights_follow_keras_order_when_tff_creates_them_in_another(tmp_path):
  # Keras lists the Reversed layer's `second` Dense first; TFF creates `first` first.
  model = keras_model("reversed_weights")
  assert [n.split("/")[-2] for n in model.weight_names] == [
      "second", "second", "first", "first", "head", "head"]
  path = tmp_path / "final_model.npz"
  export_model(path, model.initial_weights, model.weight_names)
  with np.load(path) as f:
    arrays = [f[k] for k in f.files]
  second_w, second_b, first_w, first_b, head_w, head_b = arrays
  want = np_forward(first_w, first_b, second_w, second_b, X) @ head_w + head_b
  got = in_graph(model.evaluate_predict, weights(model), X)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  keras = keras_builders.reversed_weights((3,), 3)
  keras.set_weights(arrays)
  np.testing.assert_allclose(keras(X, training=False).numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arrays, message", [
    ({"dense/kernel": np.zeros((3, 3))},
     "model.initial_weights: {path} holds 1 array; the model has 2 weights"
     " (dense/kernel, dense/bias)"),
    ({"dense/kernel": np.zeros((3, 5)), "dense/bias": np.zeros(3)},
     "model.initial_weights: {path}: array 'dense/kernel' has shape [3, 5], but the model's"
     " weight 'dense/kernel' at that position has [3, 3]"),
    ({"dense/kernel": np.full((3, 3), np.nan), "dense/bias": np.zeros(3)},
     "model.initial_weights: {path}: array 'dense/kernel' is not all finite numbers"),
])
def test_initial_weights_that_do_not_fit_name_the_array(tmp_path, arrays, message):
  path = tmp_path / "w.npz"
  np.savez(path, **arrays)
  with pytest.raises(UserError) as info:
    keras_model("dense", initial_weights=path)
  # Keras numbers layer names per process (dense_7): compare without the number.
  assert re.sub(r"dense_\d+/", "dense/", str(info.value)) == message.format(path=path)


def test_initial_weights_not_an_npz(tmp_path):
  path = tmp_path / "w.npz"
  path.write_text("not a zip")
  with pytest.raises(UserError, match=rf"^model.initial_weights: {path}: not a readable"
                                      r" .npz file \(.*\)$"):
    keras_model("dense", initial_weights=path)
