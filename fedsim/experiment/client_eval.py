"""Per-client evaluation: the global model on each client's own test split.

All evaluated clients' test batches go through one compiled computation per
evaluation (not one call per client): each batch holds one client's
examples only, the computation returns the statistics of every batch, and
NumPy sums them per client.
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping, Sequence

import numpy as np

from fedsim.data.federated import Examples
from fedsim.data.packing import pack
from fedsim.learning.loss import batch_loss
from fedsim.models.functional import TaskModel

PREFIX = "eval_clients/"
_PERCENTILES = (10, 50, 90)
CHUNK_BYTES = 64 * 2**20  # test features evaluated in one call, at most (about)


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
                          as_function=None):
  """`(weights, round) -> eval_clients/* metrics` over the clients `choose(round)` names.

  Runs as one TFF computation where `as_function` puts it, as the pooled test
  set's evaluator does (see `server_eval.make_evaluator`), in inference mode.
  """
  import tensorflow as tf
  import tensorflow_federated as tff

  @functools.lru_cache(maxsize=None)
  def per_batch(size: int):
    """The computation for batches of `size` (one per power of two used)."""

    @tff.tensorflow.computation(model.weights_type, model.client_data_type(size))
    def stats(model_weights, batches):
      weights = tuple(model_weights.trainable)

      def one(i):
        _, batch = batch_loss(model.evaluate_predict, weights, batches["x"][i],
                              batches["y"][i], batches["mask"][i], model.pad_label)
        return tf.stack([batch.correct, batch.num_targets])

      return tf.map_fn(one, tf.range(tf.shape(batches["mask"])[0]),
                       fn_output_signature=tf.TensorSpec([2], tf.float32))

    return as_function(stats) if as_function is not None else stats

  def evaluate_chunk(model_weights, tests: Sequence[Examples]) -> np.ndarray:
    """float64 [len(tests), 2]: each client's (correct, targets)."""
    # Clients hold few test examples each: batches no larger than the largest
    # client's (rounded up to a power of two, to compile few sizes) pad less.
    size = min(batch_size, 1 << (max(map(len, tests)) - 1).bit_length())
    batches, owner = _packed(tests, size)
    stats = np.asarray(per_batch(size)(model_weights, batches), np.float64).reshape(-1, 2)
    return np.stack([np.bincount(owner, stats[:, k], minlength=len(tests)) for k in (0, 1)],
                    axis=1)

  def evaluate(model_weights, round_num: int) -> dict[str, float]:
    # In chunks of clients, so that evaluating `all` of a large population
    # never holds every client's test examples at once; the counts are exact
    # integers, so chunking changes no metric.
    counts = [evaluate_chunk(model_weights, chunk)
              for chunk in _chunks(client_test, choose(round_num))]
    if not counts:
      return {}
    correct, targets = np.concatenate(counts).T
    return client_accuracy_metrics(correct, targets)

  return evaluate


def _chunks(client_test: Mapping[str, Examples], ids: Sequence[str]):
  """The test splits of `ids` (those with examples), in lists of about CHUNK_BYTES."""
  chunk, size, chunk_bytes = [], 0, CHUNK_BYTES
  for cid in ids:
    test = client_test.get(cid)
    if test is None or not len(test):
      continue
    if chunk and size + test.x.nbytes > chunk_bytes:
      yield chunk
      chunk, size = [], 0
    chunk.append(test)
    size += test.x.nbytes
  if chunk:
    yield chunk


def _packed(tests: Sequence[Examples], batch_size: int):
  """(the clients' batches laid end to end, index of the client owning each batch)."""
  parts = [pack(examples, batch_size, shuffle=False) for examples in tests]
  owner = np.repeat(np.arange(len(parts)), [len(p.mask) for p in parts])
  batches = {key: np.concatenate([getattr(p, key) for p in parts])
             for key in ("x", "y", "mask")}
  return batches, owner
