"""Per-client evaluation: the global model on each client's own test split.

All evaluated clients' test batches go through one compiled computation per
evaluation (not one call per client): each batch holds one client's
examples only, the computation returns the statistics of every batch, and
NumPy sums them per client.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from fedsim.data.federated import Examples
from fedsim.data.packing import pack
from fedsim.learning import local_training
from fedsim.models.functional import TaskModel

PREFIX = "eval_clients/"
_PERCENTILES = (10, 50, 90)


def client_accuracy_metrics(correct: np.ndarray, targets: np.ndarray) -> dict[str, float]:
  """The `eval_clients/*` metrics from per-client counts.

  Args:
    correct, targets: per client, correctly predicted targets and targets
      (examples, or real tokens of sequences). Clients with no target count
      in nothing.

  Returns:
    'accuracy_weighted' (all clients' correct / all targets: each target
    weighs the same), 'accuracy_mean' (unweighted mean of client
    accuracies), 'accuracy_p10/_p50/_p90' (percentiles of client accuracy,
    linear interpolation) and 'num_clients' (clients evaluated), each under
    `eval_clients/`; {} when no client has a target.
  """
  correct, targets = np.asarray(correct, float), np.asarray(targets, float)
  has = targets > 0
  if not has.any():
    return {}
  accuracy = correct[has] / targets[has]
  out = {"accuracy_weighted": correct[has].sum() / targets[has].sum(),
         "accuracy_mean": accuracy.mean()}
  for q, value in zip(_PERCENTILES, np.percentile(accuracy, _PERCENTILES)):
    out[f"accuracy_p{q}"] = value
  out["num_clients"] = int(has.sum())
  return {PREFIX + k: float(v) for k, v in out.items()}


def make_client_evaluator(model: TaskModel, client_test: Mapping[str, Examples],
                          batch_size: int, choose: Callable[[int], Sequence[str]],
                          runtime=None):
  """`(weights, round) -> eval_clients/* metrics` over the clients `choose(round)` names.

  Runs as one TFF computation on the runtime that evaluates the pooled test
  set (see `simulation.make_evaluator`), in inference mode.
  """
  import tensorflow as tf
  import tensorflow_federated as tff

  @tff.tensorflow.computation(model.weights_type, model.client_data_type(batch_size))
  def per_batch(model_weights, batches):
    weights = tuple(model_weights.trainable)

    def one(i):
      _, stats = local_training.batch_loss(model.evaluate_predict, weights, batches["x"][i],
                                           batches["y"][i], batches["mask"][i],
                                           model.pad_label)
      return tf.stack([stats.correct, stats.num_targets])

    return tf.map_fn(one, tf.range(tf.shape(batches["mask"])[0]),
                     fn_output_signature=tf.TensorSpec([2], tf.float32))

  if runtime is not None and runtime.name == "inprocess":
    from fedsim.runtime import inprocess
    per_batch = inprocess.tensorflow_function(per_batch, runtime.device)

  def evaluate(model_weights, round_num: int) -> dict[str, float]:
    batches, owner, clients = _packed(client_test, choose(round_num), batch_size)
    if not clients:
      return {}
    stats = np.asarray(per_batch(model_weights, batches), np.float64).reshape(-1, 2)
    correct = np.bincount(owner, stats[:, 0], minlength=clients)
    targets = np.bincount(owner, stats[:, 1], minlength=clients)
    return client_accuracy_metrics(correct, targets)

  return evaluate


def _packed(client_test: Mapping[str, Examples], ids: Sequence[str], batch_size: int):
  """(batches of all clients laid end to end, owning client of each batch, clients)."""
  parts, owner = [], []
  for cid in ids:
    examples = client_test.get(cid)
    if examples is None or not len(examples):
      continue
    packed = pack(examples, batch_size, shuffle=False)
    owner += [len(parts)] * len(packed.mask)
    parts.append(packed)
  if not parts:
    return None, np.zeros(0, int), 0
  batches = {key: np.concatenate([getattr(p, key) for p in parts])
             for key in ("x", "y", "mask")}
  return batches, np.asarray(owner), len(parts)
