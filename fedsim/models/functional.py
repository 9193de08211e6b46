"""A registered Keras model as a pure function of its weights.

The only fedsim module that calls `tff.learning.models.functional_model_from_keras`.
Training code sees `predict(trainable_weights, x) -> logits`, so weights are
plain tensors that TFF computations pass around, encoders compress and
checkpoints store. Weights are kept in the order of `keras_model.get_weights()`
(TFF's own order is that of variable creation, which can differ), so a saved
model loads back with `keras_model.set_weights`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.config.typed import Component
from fedsim.errors import UserError
from fedsim.models import MODELS, first_line
from fedsim.models.keras_checks import conform
from fedsim.models.weights_file import load_weights, npz_keys


@dataclasses.dataclass(frozen=True)
class TaskModel:
  """A model bound to a dataset's input shape and class count.

  `predict` runs the model as in training (dropout on), `evaluate_predict`
  as in inference (dropout off); both map `(trainable_weights, x)` to
  logits and trace only inside TFF computations or graphs.
  """

  predict: Callable[[Any, tf.Tensor], tf.Tensor]
  evaluate_predict: Callable[[Any, tf.Tensor], tf.Tensor]
  initial_weights: tff.learning.models.ModelWeights  # of NumPy arrays
  weights_type: tff.types.StructType                 # TFF type of ModelWeights
  num_params: int
  input_shape: tuple[int, ...]
  num_classes: int
  x_dtype: Any = np.float32
  label_shape: tuple[int, ...] = ()
  pad_label: int | None = None  # sequence targets: padding label, not counted
  weight_names: tuple[str, ...] = ()  # .npz key of each trainable weight, e.g. "dense/kernel"

  def client_data_type(self, batch_size: int) -> tff.types.StructType:
    """TFF type of one client's packed batches for this model."""
    return client_data_type(self.input_shape, batch_size, self.x_dtype, self.label_shape)


def client_data_type(input_shape, batch_size: int, x_dtype=np.float32,
                     label_shape=()) -> tff.types.StructType:
  """TFF type of one client's packed batches (data/packing.py); the step count is dynamic.

  `label_shape` is () for one label per example, (T,) for sequence targets.
  """
  return tff.types.to_type(collections.OrderedDict(
      x=tff.TensorType(np.dtype(x_dtype), [None, batch_size, *input_shape]),
      y=tff.TensorType(np.int32, [None, batch_size, *label_shape]),
      mask=tff.TensorType(np.float32, [None, batch_size]),
  ))


def build_task_model(spec: Component, input_shape, num_classes: int, seed: int,
                     x_dtype=np.float32, label_shape=(), pad_label=None,
                     precision: str = "float32") -> TaskModel:
  """Builds the registered model `spec` with weights initialized from `seed`.

  Weights come from `spec.params.initial_weights` (an .npz file) instead when set.
  With `precision` 'bfloat16', `predict` (training) runs a bfloat16 copy of
  the model on the float32 weights cast down and returns float32 logits, so
  gradients, updates and optimizers stay float32; `evaluate_predict` stays
  float32, so accuracy is that of the float32 weights.

  Raises:
    UserError: one line naming the model (and layer or file) when it cannot
      be trained correctly (see `keras_checks.conform`) or the initial
      weights do not fit it.
    ValueError: from a built-in builder, for an input shape it cannot take.
  """
  tf.keras.utils.set_random_seed(seed)
  keras_model = MODELS.get(spec.name).build(spec.params, tuple(input_shape), num_classes)
  culprit = _culprit(spec)
  keras_model = conform(keras_model, tuple(input_shape), np.dtype(x_dtype),
                        (*label_shape, num_classes), culprit)
  names = npz_keys([v.name for v in keras_model.trainable_weights])
  # Everything that uses the Keras model eagerly comes first: cloning it in a
  # graph (below, and inside TFF) leaves it unusable outside that graph.
  order = _creation_order(keras_model, culprit)
  x_type = tf.as_dtype(np.dtype(x_dtype))
  train_model, compute = keras_model, tf.float32
  if precision == "bfloat16":
    train_model, compute = _in_dtype(keras_model, "bfloat16", culprit), tf.bfloat16
  functional = _functional(keras_model, input_shape, x_type, label_shape, culprit)
  trained = functional if train_model is keras_model else _functional(
      train_model, input_shape, compute if x_type.is_floating else x_type, label_shape,
      culprit)

  def tff_order(trainable):
    return (tuple(trainable[i] for i in order), ())

  def predict(trainable, x):
    if compute == tf.float32:
      return trained.predict_on_batch(tff_order(trainable), x, training=True)
    weights = tuple(tf.cast(w, compute) for w in trainable)
    x = tf.cast(x, compute) if x.dtype.is_floating else x
    return tf.cast(trained.predict_on_batch(tff_order(weights), x, training=True), tf.float32)

  def evaluate_predict(trainable, x):
    return functional.predict_on_batch(tff_order(trainable), x, training=False)

  trainable = [None] * len(order)
  for position, index in enumerate(order):
    trainable[index] = np.asarray(functional.initial_weights[0][position], np.float32)
  initial_path = getattr(spec.params, "initial_weights", None)
  if initial_path is not None:
    trainable = load_weights(initial_path, names, [w.shape for w in trainable])
  trainable = tuple(trainable)
  weights = tff.learning.models.ModelWeights(trainable=trainable, non_trainable=())
  specs = tff.learning.models.ModelWeights(
      trainable=tuple(tf.TensorSpec(w.shape, tf.float32) for w in trainable), non_trainable=())
  return TaskModel(
      predict=predict, evaluate_predict=evaluate_predict, initial_weights=weights,
      weights_type=tff.types.tensorflow_to_type(specs),
      num_params=int(sum(w.size for w in trainable)),
      input_shape=tuple(input_shape), num_classes=num_classes,
      x_dtype=np.dtype(x_dtype), label_shape=tuple(label_shape), pad_label=pad_label,
      weight_names=names)


def _functional(keras_model, input_shape, x_type, label_shape, culprit: str):
  """TFF's functional model of `keras_model` (which it clones in a graph)."""
  x_spec = tf.TensorSpec([None, *input_shape], x_type)
  try:
    return tff.learning.models.functional_model_from_keras(
        keras_model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=(x_spec, tf.TensorSpec([None, *label_shape], tf.int32)))
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"{culprit}: TFF cannot make a functional model of it"
                    f" ({type(e).__name__}: {first_line(e)})") from None


def _in_dtype(keras_model, dtype: str, culprit: str):
  """A copy of `keras_model` (same layers, fresh weights) whose every layer uses `dtype`.

  Its weights are never read: `predict` passes the float32 ones cast down.

  Raises:
    UserError: the model cannot be rebuilt from its config.
  """
  config = keras_model.get_config()
  for layer in config.get("layers", []):
    if "dtype" in layer.get("config", {}):
      layer["config"]["dtype"] = dtype
  try:
    return keras_model.__class__.from_config(config)
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"{culprit}: runtime.precision {dtype} rebuilds the model from its"
                    f" config, which failed ({type(e).__name__}: {first_line(e)})") from None


def _culprit(spec: Component) -> str:
  culprit = getattr(spec.params, "culprit", None)
  return culprit() if callable(culprit) else f"model.name: '{spec.name}'"


def _creation_order(keras_model: tf.keras.Model, culprit: str) -> list[int]:
  """`order[i]`: index in `keras_model.trainable_weights` of TFF's i-th weight.

  TFF's functional model takes its weights in the order in which cloning
  the model creates variables; the same clone is replayed here to learn it.

  Raises:
    UserError: if the model cannot be cloned (a subclassed model, a custom
      layer without `get_config`) or shares variables between layers.
  """
  created = []

  def record(next_creator, **kwargs):
    variable = next_creator(**kwargs)
    created.append(variable)
    return variable

  with tf.Graph().as_default(), tf.variable_creator_scope(record):
    try:
      clone = tf.keras.models.clone_model(keras_model)
    except Exception as e:  # pylint: disable=broad-except
      raise UserError(f"{culprit}: the model cannot be cloned ({type(e).__name__}:"
                      f" {first_line(e)}); build it with tf.keras.Sequential or"
                      " tf.keras.Model(inputs, outputs), from layers whose get_config"
                      " holds every constructor argument") from None
  position = {v.ref(): i for i, v in enumerate(clone.trainable_weights)}
  order = [position[v.ref()] for v in created if v.ref() in position]
  if sorted(order) != list(range(len(keras_model.trainable_weights))):
    raise UserError(f"{culprit}: cloning the model makes {len(order)} trainable variables"
                    f" where it has {len(keras_model.trainable_weights)} (layers sharing"
                    " variables?); give each layer its own weights")
  return order
