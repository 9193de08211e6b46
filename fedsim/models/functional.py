"""A registered Keras model as a pure function of its weights.

The only fedsim module that calls `tff.learning.models.functional_model_from_keras`.
Training code sees `predict(trainable_weights, x) -> logits`, so weights are
plain tensors that TFF computations pass around, encoders compress and
checkpoints store.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.config.typed import Component
from fedsim.models import MODELS


@dataclasses.dataclass(frozen=True)
class TaskModel:
  """A model bound to a dataset's input shape and class count."""

  predict: Callable[[Any, tf.Tensor], tf.Tensor]
  initial_weights: tff.learning.models.ModelWeights  # of NumPy arrays
  weights_type: tff.types.StructType                 # TFF type of ModelWeights
  num_params: int
  input_shape: tuple[int, ...]
  num_classes: int
  x_dtype: Any = np.float32
  label_shape: tuple[int, ...] = ()
  pad_label: int | None = None  # sequence targets: padding label, not counted

  def client_data_type(self, batch_size: int):
    """TFF type of one client's packed batches for this model."""
    from fedsim.learning.client_work import client_data_type
    return client_data_type(self.input_shape, batch_size, self.x_dtype, self.label_shape)


def build_task_model(spec: Component, input_shape, num_classes: int, seed: int,
                     x_dtype=np.float32, label_shape=(), pad_label=None) -> TaskModel:
  """Builds the registered model `spec` with weights initialized from `seed`.

  Raises:
    ValueError: if the model has non-trainable weights (batch norm statistics
      would silently stop updating in a functional training loop).
  """
  tf.keras.utils.set_random_seed(seed)
  keras_model = MODELS.get(spec.name).build(spec.params, tuple(input_shape), num_classes)
  if keras_model.non_trainable_weights:
    raise ValueError(f"model '{spec.name}' has non-trainable weights, which fedsim's"
                     " functional training loop cannot update")
  x_spec = tf.TensorSpec([None, *input_shape], tf.as_dtype(np.dtype(x_dtype)))
  functional = tff.learning.models.functional_model_from_keras(
      keras_model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=(x_spec, tf.TensorSpec([None, *label_shape], tf.int32)))

  def predict(trainable, x):
    return functional.predict_on_batch((tuple(trainable), ()), x, training=True)

  trainable = tuple(np.asarray(w, np.float32) for w in functional.initial_weights[0])
  weights = tff.learning.models.ModelWeights(trainable=trainable, non_trainable=())
  specs = tff.learning.models.ModelWeights(
      trainable=tuple(tf.TensorSpec(w.shape, tf.float32) for w in trainable), non_trainable=())
  return TaskModel(
      predict=predict, initial_weights=weights,
      weights_type=tff.types.tensorflow_to_type(specs),
      num_params=int(sum(w.size for w in trainable)),
      input_shape=tuple(input_shape), num_classes=num_classes,
      x_dtype=np.dtype(x_dtype), label_shape=tuple(label_shape), pad_label=pad_label)
