"""The client-work stage's training metrics, against NumPy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.learning import client_work, local_training
from fedsim.models.functional import client_data_type


def test_sequence_train_metrics_are_token_weighted_over_clients(tff_runtime):
  """Loss and accuracy over all clients' real tokens; examples exclude all-padding rows."""
  weights_type = tff.types.to_type(tff.learning.models.ModelWeights(
      trainable=(tff.TensorType(np.float32, [2, 3]),), non_trainable=()))
  data_type = client_data_type((4, 2), batch_size=2, label_shape=(4,))

  def predict(weights, x):
    return tf.einsum("btd,dc->btc", x, weights[0])

  def update_fn(model_weights, batches):
    stats = local_training.evaluate(predict, model_weights.trainable, batches, pad_label=0)
    return tuple(tf.zeros_like(w) for w in model_weights.trainable), stats.num_examples, stats

  work = client_work.build_client_work(weights_type, data_type, update_fn)
  rng = np.random.default_rng(2)
  w = rng.normal(size=(2, 3)).astype(np.float32)
  clients = []
  for labels in ([[[1, 2, 2, 0], [0, 0, 0, 0]]], [[[2, 1, 1, 1], [1, 0, 0, 0]]]):
    y = np.array(labels, np.int32)
    clients.append({"x": rng.normal(size=(1, 2, 4, 2)).astype(np.float32), "y": y,
                    "mask": np.ones((1, 2), np.float32)})
  out = work.process.next(work.process.initialize(),
                          [tff.learning.models.ModelWeights((w,), ())] * 2, clients)

  losses, hits = [], []
  for c in clients:
    logits = c["x"][0].astype(np.float64) @ w
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    for e, t in zip(*np.nonzero(c["y"][0])):
      losses.append(-log_p[e, t, c["y"][0][e, t]])
      hits.append(logits[e, t].argmax() == c["y"][0][e, t])
  assert len(losses) == 3 + 5
  np.testing.assert_allclose(float(out.measurements["loss"]), np.mean(losses), rtol=1e-5)
  np.testing.assert_allclose(float(out.measurements["accuracy"]), np.mean(hits), rtol=1e-6)
  assert float(out.measurements["num_examples"]) == 1 + 2
