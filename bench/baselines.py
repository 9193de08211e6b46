"""The two reference points fedsim's runtimes are measured against.

* Stock TFF: `tff.learning.algorithms.build_weighted_fed_avg` on a Keras
  model, each client a tf.data dataset, run on TFF's C++ worker.
* Lower bound: the same local SGD steps in plain TensorFlow, one
  `tf.function` call per client over pre-batched tensors, weighted mean of
  the client models on the server. It skips everything a federated runtime
  adds (metrics, types, serialization), so no runtime can beat it by much.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


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


def lower_bound_round(keras_model: tf.keras.Model, packed, client_lr: float,
                      server_lr: float) -> Callable[[], None]:
  """A no-arg function running one round of plain-TensorFlow FedAvg.

  `packed` is a list of per-client dicts of `x [steps, batch, ...]`, `y`,
  `mask` (as fedsim packs them); every batch must be full (no padding), as
  in the benchmark workloads, so the masks are not read.
  """
  variables = keras_model.trainable_variables
  global_weights = [tf.constant(v.numpy()) for v in variables]
  inputs = [(tf.constant(c["x"]), tf.constant(c["y"]),
             tf.constant(float(c["mask"].sum()))) for c in packed]
  if any(float(c["mask"].min()) < 1 for c in packed):
    raise ValueError("the lower bound assumes full batches")
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
