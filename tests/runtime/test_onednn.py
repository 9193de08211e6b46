"""Max-pooling gradients of compiled CNN rounds run on oneDNN's kernel, with the same numbers."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from fedsim.backend import onednn
from fedsim.runtime import inprocess
from tests.learning import builders
from tests.runtime.test_inprocess import _clients, _leaves, _run

needs_onednn = pytest.mark.skipif(not onednn.applies("/CPU:0"),
                                  reason="this TensorFlow runs no oneDNN kernels")


def _pool_and_gradient(dtype=tf.float32):
  """A graph whose max-pool and its gradient are in functions it calls, as Keras's are."""

  @tf.function
  def pool(x):
    return tf.nn.max_pool2d(x, 2, 2, "SAME")

  @tf.function
  def loss_gradient(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.reduce_sum(pool(x) ** 2)
    return tape.gradient(y, x)

  return loss_gradient.get_concrete_function(
      tf.TensorSpec([2, 4, 4, 3], dtype)).graph.as_graph_def()


def _all_nodes(graph_def):
  return [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]


def test_pools_of_a_training_graph_become_onednn_pools_and_functions_stay_linked():
  graph_def = _pool_and_gradient()
  paired = onednn.pair_max_pools(graph_def)
  pools = [n for n in _all_nodes(paired) if n.op == "_MklNativeMaxPool"]
  assert pools and not any(n.op == "MaxPool" for n in _all_nodes(paired))
  for pool in pools:
    assert pool.attr["workspace_enabled"].b and pool.attr["_kernel"].s == b"MklNameChangeOp"
  # The original is untouched, and every function referenced is defined.
  assert any(n.op == "MaxPool" for n in _all_nodes(graph_def))
  defined = {f.signature.name for f in paired.library.function}
  original = {f.signature.name for f in graph_def.library.function}
  assert defined and not defined & original
  called = {v.func.name for n in _all_nodes(paired) for v in n.attr.values()
            if v.HasField("func")}
  assert called and called <= defined
  # A second copy gets names of its own: TensorFlow keeps one definition per name.
  again = {f.signature.name for f in onednn.pair_max_pools(graph_def).library.function}
  assert not again & defined


def test_graphs_without_a_pool_gradient_or_a_float32_pool_are_left_alone():
  @tf.function
  def forward(x):
    return tf.nn.max_pool2d(x, 2, 2, "SAME")

  forward_only = forward.get_concrete_function(tf.TensorSpec([2, 4, 4, 3])).graph.as_graph_def()
  assert onednn.pair_max_pools(forward_only) is forward_only
  float64 = _pool_and_gradient(tf.float64)
  assert onednn.pair_max_pools(float64) is float64
  assert not onednn.applies("/GPU:0")


@needs_onednn
def test_a_cnn_round_runs_onednn_pool_gradients_and_equals_the_unpaired_round(
    tff_runtime, monkeypatch):
  model = builders.task_model("cnn", input_shape=(16,), num_classes=3, filters=(2, 3), dense=4)
  algorithm = builders.algorithm("fedavg", {"client_optimizer": {"name": "sgd",
                                                                 "learning_rate": 0.3}}, model)
  rounds = [_clients(3, [2, 3, 1], dim=16, classes=3), _clients(4, [3, 1], dim=16, classes=3)]

  ctx = context.context()
  ctx.enable_run_metadata()
  try:
    state, metrics = _run(inprocess.InProcessProcess(algorithm.process, "cpu"), rounds)
    graphs = ctx.export_run_metadata().function_graphs
  finally:
    ctx.disable_run_metadata()
  executed = [n.op for g in graphs for p in g.partition_graphs for n in p.node]
  assert executed.count("_MklNativeMaxPoolGrad") >= 2 and "MaxPoolGrad" not in executed

  # Bit for bit what TensorFlow computes when it pairs the pools itself (or with
  # its own gradient kernel), and TFF's runtime to float rounding.
  monkeypatch.setattr(onednn, "applies", lambda device: False)
  unpaired = inprocess.InProcessProcess(algorithm.process, "cpu")
  unpaired_state, unpaired_metrics = _run(unpaired, rounds)
  want_state, want_metrics = _run(algorithm.process, rounds)
  for got, same, near in [(state, unpaired_state, want_state),
                          (metrics, unpaired_metrics, want_metrics)]:
    for g, s, w in zip(_leaves(got), _leaves(same), _leaves(near), strict=True):
      np.testing.assert_array_equal(g, s)
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  assert not np.allclose(algorithm.model_weights(state).trainable[0],
                         model.initial_weights.trainable[0])
