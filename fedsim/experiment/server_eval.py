"""The server's evaluation: the global model on the held-out test set, each round
it evaluates (`eval.every`), run where training runs."""

from __future__ import annotations

from fedsim.data.federated import FederatedData
from fedsim.data.packing import pack
from fedsim.learning import local_training
from fedsim.metric_names import EVAL_ACCURACY, EVAL_LOSS
from fedsim.models.functional import TaskModel


def make_evaluator(model: TaskModel, data: FederatedData, batch_size: int,
                   as_function=None):
  """`weights -> {eval/loss, eval/accuracy}` on the held-out test set (server side).

  A TFF computation (TFF's functional Keras models only trace inside TFF
  computations or graphs), run where `as_function(computation)` puts it:
  the runtime's `function` (None: TFF's worker). The model runs in inference
  mode (`evaluate_predict`: dropout off).
  """
  import tensorflow_federated as tff
  size = min(batch_size, max(len(data.test), 1))
  test = pack(data.test, size, shuffle=False)
  batches = {"x": test.x, "y": test.y, "mask": test.mask}

  @tff.tensorflow.computation(model.weights_type, model.client_data_type(size))
  def stats(model_weights, batches):
    return local_training.evaluate(model.evaluate_predict, model_weights.trainable, batches,
                                   model.pad_label)

  if as_function is not None:
    stats = as_function(stats)

  def evaluate(model_weights) -> dict[str, float]:
    # Means over targets: examples, or real tokens of sequences (token-weighted).
    loss_sum, correct, _, targets = stats(model_weights, batches)
    n = max(float(targets), 1.0)
    return {EVAL_LOSS: float(loss_sum) / n, EVAL_ACCURACY: float(correct) / n}

  return evaluate
