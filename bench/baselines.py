"""The reference points fedsim's runtimes are measured against.

* Stock TFF: `tff.learning.algorithms.build_weighted_fed_avg` on a Keras
  model, each client a tf.data dataset, run on TFF's C++ worker.
* Graph loop (`graph_loop_round`): the best hand-written TensorFlow does for
  the same round -- every client in one `tf.function`, a `tf.while_loop` over
  clients around a `tf.while_loop` over their batches, plain SGD on the
  model written as TF ops, the mean of the client deltas applied by server
  SGD. It skips everything a federated runtime adds (metrics, types,
  serialization), so it is the bound fedsim's rounds are held to.
* Python loop (`lower_bound_round`): one `tf.function` call per client.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.backend import onednn


def stock_tff_round(keras_model_fn: Callable[[], tf.keras.Model], clients, batch_size: int,
                    client_lr: float, server_lr: float) -> Callable[[], None]:
  """A no-arg function running one FedAvg round of stock TFF on `clients`.

  `clients` is a list of (x, y) NumPy arrays; the state carries over calls.
  """
  x0, y0 = clients[0]
  input_spec = (tf.TensorSpec([None, *x0.shape[1:]], tf.float32),
                tf.TensorSpec([None], tf.int32))

  def model_fn():
    return tff.learning.models.from_keras_model(
        keras_model_fn(), input_spec=input_spec,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(client_lr),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(server_lr))
  datasets = [tf.data.Dataset.from_tensor_slices((x.astype(np.float32), y.astype(np.int32)))
              .batch(batch_size) for x, y in clients]
  state = [process.initialize()]

  def run_round():
    state[0] = process.next(state[0], datasets).state

  return run_round


def mlp_forward(weights, x):
  """Logits of the Keras `mlp` (Dense layers, ReLU) from its `get_weights()` order."""
  h = tf.reshape(x, [tf.shape(x)[0], -1])
  for i in range(0, len(weights) - 2, 2):
    h = tf.nn.relu(tf.matmul(h, weights[i]) + weights[i + 1])
  return tf.matmul(h, weights[-2]) + weights[-1]


def cnn_forward(weights, x):
  """Logits of the Keras `cnn` (5x5 'same' convs + ReLU + 2x2 max-pools, dense, dense)."""
  h = x
  for i in range(0, len(weights) - 4, 2):
    h = tf.nn.relu(tf.nn.conv2d(h, weights[i], 1, "SAME") + weights[i + 1])
    h = tf.nn.max_pool2d(h, 2, 2, "SAME")
  h = tf.reshape(h, [tf.shape(h)[0], -1])
  h = tf.nn.relu(tf.matmul(h, weights[-4]) + weights[-3])
  return tf.matmul(h, weights[-2]) + weights[-1]


def simple_cnn_forward(weights, x):
  """Logits of bench/workloads.py's `simple_cnn` (P1: two valid 3x3 convs + ReLU, one 2x2
  max-pool, dense 128 + ReLU, dense)."""
  h = tf.nn.relu(tf.nn.conv2d(x, weights[0], 1, "VALID") + weights[1])
  h = tf.nn.relu(tf.nn.conv2d(h, weights[2], 1, "VALID") + weights[3])
  h = tf.nn.max_pool2d(h, 2, 2, "VALID")
  h = tf.reshape(h, [tf.shape(h)[0], -1])
  h = tf.nn.relu(tf.matmul(h, weights[4]) + weights[5])
  return tf.matmul(h, weights[6]) + weights[7]


def training_flops(keras_model: tf.keras.Model) -> float:
  """FLOPs of one example's training step: 3 x forward, forward = 2 x MACs.

  MACs count Dense (inputs x units) and Conv2D (output positions x filters
  x kernel height x width x input channels) layers; the backward pass costs
  about twice the forward (the gradients w.r.t. inputs and w.r.t. weights),
  hence 3x. Bias adds, activations, pooling and the loss are left out (well
  under 1% of these models' arithmetic).
  """
  macs = 0
  for layer in keras_model.layers:
    if isinstance(layer, tf.keras.layers.Dense):
      macs += int(layer.kernel.shape[0]) * int(layer.kernel.shape[1])
    elif isinstance(layer, tf.keras.layers.Conv2D):
      kh, kw, cin, cout = (int(d) for d in layer.kernel.shape)
      _, oh, ow, _ = layer.output.shape
      macs += int(oh) * int(ow) * cout * kh * kw * cin
  return 3 * 2 * float(macs)


def graph_loop_round(forward, initial_weights, packed, client_lr: float, server_lr: float,
                     compute_dtype=tf.float32, pair_pools: bool = True) -> Callable[[], None]:
  """A no-arg function running one FedAvg round as one hand-written TF graph.

  `packed`: per-client dicts of `x [steps, batch, ...]`, `y`, `mask` (as
  fedsim packs them); every client must have the same number of full
  batches, as in the benchmark workloads, so the mean of deltas is the
  example-weighted one. `compute_dtype` bfloat16 runs forward and backward
  in bfloat16 from float32 weights (the weights, updates and SGD stay
  float32). `pair_pools`: max-pool gradients on oneDNN's kernel for sure, as
  fedsim's compiled round has them (`fedsim.backend.onednn`); False leaves it
  to TensorFlow's layout pass, a draw per process. The state carries over calls.
  """
  if len({c["x"].shape for c in packed}) != 1 or any(c["mask"].min() < 1 for c in packed):
    raise ValueError("the graph loop assumes equal clients with full batches")
  x_all = tf.constant(np.stack([c["x"] for c in packed]))
  y_all = tf.constant(np.stack([c["y"] for c in packed]).astype(np.int32))
  state = [tuple(tf.constant(w, tf.float32) for w in initial_weights)]

  def batch_gradient(weights, x, y):
    with tf.GradientTape() as tape:
      tape.watch(weights)
      compute = [tf.cast(w, compute_dtype) for w in weights]
      logits = tf.cast(forward(compute, tf.cast(x, compute_dtype)), tf.float32)
      loss = tf.reduce_mean(
          tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return tape.gradient(loss, weights)

  @tf.function
  def round_fn(global_weights, x_all, y_all):
    num_clients, num_steps = tf.shape(x_all)[0], tf.shape(x_all)[1]

    def client(c, delta_sum):
      def step(i, weights):
        grads = batch_gradient(weights, x_all[c, i], y_all[c, i])
        return i + 1, tuple(w - client_lr * g for w, g in zip(weights, grads))

      _, trained = tf.while_loop(lambda i, _: i < num_steps, step,
                                 (tf.constant(0), global_weights))
      return c + 1, tuple(d + (g - t) for d, g, t in zip(delta_sum, global_weights, trained))

    _, delta_sum = tf.while_loop(
        lambda c, _: c < num_clients, client,
        (tf.constant(0), tuple(tf.zeros_like(w) for w in global_weights)))
    count = tf.cast(num_clients, tf.float32)
    return tuple(w - server_lr * d / count for w, d in zip(global_weights, delta_sum))

  if pair_pools and onednn.applies("/CPU:0"):
    concrete = round_fn.get_concrete_function(state[0], x_all, y_all)
    graph_def = concrete.graph.as_graph_def()
    paired = onednn.pair_max_pools(graph_def)
    if paired is not graph_def:  # a model with max-pools: W2's round stays as it is
      round_fn = _imported(concrete, paired)

  def run_round():
    state[0] = round_fn(state[0], x_all, y_all)
    state[0][0].numpy()  # wait for the round, as fedsim's rounds return NumPy

  return run_round


def _imported(concrete, graph_def):
  """`concrete`'s round as `graph_def` (its graph rewritten), called like `concrete`."""
  inputs = [t.name for t in concrete.inputs]
  outputs = [t.name for t in concrete.outputs]
  specs = [tf.TensorSpec(t.shape, t.dtype) for t in concrete.inputs]
  imported = tf.compat.v1.wrap_function(
      lambda *args: tf.graph_util.import_graph_def(
          graph_def, input_map=dict(zip(inputs, args)), return_elements=outputs), specs)

  def call(weights, x_all, y_all):
    return tuple(imported(*weights, x_all, y_all))

  return call


def lower_bound_round(keras_model: tf.keras.Model, packed, client_lr: float,
                      server_lr: float) -> Callable[[], None]:
  """A no-arg function running one round of plain-TensorFlow FedAvg.

  `packed` is a list of per-client dicts of `x [steps, batch, ...]`, `y`,
  `mask` (as fedsim packs them); every batch must be full (no padding), as
  in the benchmark workloads: the masks only give each client's example count.
  """
  variables = keras_model.trainable_variables
  global_weights = [tf.constant(v.numpy()) for v in variables]
  inputs = [(tf.constant(c["x"]), tf.constant(c["y"]),
             tf.constant(float(c["mask"].sum()))) for c in packed]
  if any(float(c["mask"].min()) < 1 for c in packed):
    raise ValueError("the python loop assumes full batches")
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  @tf.function
  def train_client(weights, x, y):
    for v, w in zip(variables, weights):
      v.assign(w)
    for i in tf.range(tf.shape(x)[0]):
      with tf.GradientTape() as tape:
        loss = loss_fn(y[i], keras_model(x[i], training=True))
      for v, g in zip(variables, tape.gradient(loss, variables)):
        v.assign_sub(client_lr * g)
    return [tf.identity(v) for v in variables]

  def run_round():
    total = 0.0
    acc = [tf.zeros_like(w) for w in global_weights]
    for x, y, n in inputs:
      trained = train_client(global_weights, x, y)
      acc = [a + n * t for a, t in zip(acc, trained)]
      total += float(n)
    for i, (w, a) in enumerate(zip(global_weights, acc)):
      global_weights[i] = w - server_lr * (w - a / total)

  return run_round
