"""What a Keras model must be for fedsim to train it, checked on one batch.

fedsim trains a model as a pure function of its trainable weights, with the
cross-entropy computed from logits. A model that breaks that contract would
train to a silently wrong answer, so `conform` either adapts it or refuses it
with one line naming the layer:

- the model must be a layer graph (Sequential or functional), which TFF
  clones; outputs must be one tensor `[batch, *label_shape, num_classes]`;
- a final softmax (a softmax activation of the output layer, or a `Softmax`
  layer at the end) is removed, so the loss applies softmax once; outputs
  that still look like probabilities are refused;
- non-trainable weights (batch norm's moving statistics, frozen layers) and
  loss terms added by layers (regularizers, `add_loss`) are refused: the
  functional training loop neither updates the former nor adds the latter.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import tensorflow as tf

from fedsim.errors import UserError
from fedsim.models import first_line

_PROBE_BATCH = 2
_SOFTMAX_NAMES = ("softmax", "softmax_v2")


def conform(model: tf.keras.Model, input_shape, x_dtype, output_shape,
            culprit: str) -> tf.keras.Model:
  """The model to train: `model` checked, and without a final softmax.

  Args:
    model: the built Keras model (its layers may be changed in place).
    input_shape: one example's shape, without the batch axis.
    x_dtype: the dtype of the data's features.
    output_shape: the logits' shape without the batch axis.
    culprit: how errors name the model, e.g. "model.builder: mylab.models:make".

  Returns:
    `model`, or a model sharing its layers that ends before a final Softmax layer.

  Raises:
    UserError: one line naming `culprit` (and the layer) when the model
      cannot be trained correctly.
  """
  probe = _probe_batch(input_shape, x_dtype)
  try:
    outputs = model(probe, training=False)
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"{culprit}: calling the model on a batch of shape {list(probe.shape)}"
                    f" raised {type(e).__name__}: {first_line(e)}") from None
  if not getattr(model, "_is_graph_network", False):  # Keras 2's mark of a layer graph
    raise UserError(f"{culprit}: a subclassed Keras model cannot be cloned, which TFF's"
                    " functional models need; build it with tf.keras.Sequential or"
                    " tf.keras.Model(inputs, outputs)")
  want = (_PROBE_BATCH, *output_shape)
  if not isinstance(outputs, tf.Tensor):
    raise UserError(f"{culprit}: the model returns {type(outputs).__name__}; fedsim needs"
                    f" one logits tensor of shape {_shape(want)}")
  if tuple(outputs.shape) != want:
    raise UserError(f"{culprit}: the model returns outputs of shape {_shape(outputs.shape)};"
                    f" fedsim needs logits of shape {_shape(want)} (one per class of the data)")
  _refuse_non_trainable(model, culprit)
  _refuse_added_losses(model, culprit)
  return _without_final_softmax(model, probe, outputs.numpy(), culprit)


def _probe_batch(input_shape, x_dtype) -> np.ndarray:
  shape = (_PROBE_BATCH, *input_shape)
  if np.issubdtype(np.dtype(x_dtype), np.floating):
    return np.random.default_rng(0).standard_normal(shape).astype(x_dtype)
  return np.zeros(shape, x_dtype)  # Token ids: 0 is in every vocabulary.


def _shape(shape) -> str:
  return "[batch, " + ", ".join(str(d) for d in tuple(shape)[1:]) + "]"


def _layers(model: tf.keras.Model) -> Iterator[tf.keras.layers.Layer]:
  """Every layer, nested models opened, in model order."""
  for layer in model.layers:
    if isinstance(layer, tf.keras.Model):
      yield from _layers(layer)
    else:
      yield layer


def _variable_name(variable) -> str:
  return variable.name.split("/")[-1].split(":")[0]


def _refuse_non_trainable(model: tf.keras.Model, culprit: str) -> None:
  if not model.non_trainable_weights:
    return
  layer = next((l for l in _layers(model) if l.non_trainable_weights), model)
  names = [_variable_name(v) for v in layer.non_trainable_weights]
  if any(n.startswith("moving_") for n in names):
    advice = "use GroupNormalization or LayerNormalization"
  else:
    advice = "make the layer trainable or remove it"
  raise UserError(f"{culprit}: layer '{layer.name}' keeps non-trainable weights"
                  f" ({', '.join(names)}), which federated training does not update;"
                  f" {advice}")


def _refuse_added_losses(model: tf.keras.Model, culprit: str) -> None:
  if not model.losses:
    return
  layer = next((l for l in _layers(model) if l.losses), None)
  where = f"layer '{layer.name}'" if layer is not None else f"model '{model.name}'"
  raise UserError(f"{culprit}: {where} adds a loss term (a kernel, bias or activity"
                  " regularizer, or add_loss), which fedsim's training leaves out; remove it")


def _output_layer(model: tf.keras.Model):
  """The layer that computes the model's single output, nested models opened."""
  names = getattr(model, "output_names", None)
  if not names or len(names) != 1:
    return None
  try:
    layer = model.get_layer(names[0])
  except ValueError:
    return None
  return _output_layer(layer) if isinstance(layer, tf.keras.Model) else layer


def _is_softmax(activation) -> bool:
  return getattr(activation, "__name__", None) in _SOFTMAX_NAMES


def _on_last_axis(layer: tf.keras.layers.Softmax) -> bool:
  axis = layer.axis
  return axis == -1 or axis == [-1] or axis == len(layer.input_shape) - 1


def _without_final_softmax(model, probe, probabilities, culprit):
  layer = _output_layer(model)
  stripped = None
  if layer is not None and _is_softmax(getattr(layer, "activation", None)):
    # Dense(..., activation="softmax") or Activation("softmax"): TFF rebuilds
    # layers from their config, which then says "linear".
    layer.activation = tf.keras.activations.linear
    stripped = model
  elif (isinstance(layer, tf.keras.layers.Softmax) and layer in model.layers
        and _on_last_axis(layer)):
    stripped = tf.keras.Model(model.inputs, layer.input, name=model.name)
  if stripped is None:
    if probabilities.shape[-1] > 1 and _look_like_probabilities(probabilities):
      raise UserError(f"{culprit}: the model's outputs look like probabilities (they sum"
                      " to 1), but fedsim finds no final softmax to remove (a softmax"
                      " activation of the output layer or a Softmax layer at the end);"
                      " return logits")
    return model
  logits = stripped(probe, training=False).numpy()
  if not np.allclose(_softmax(logits), probabilities, rtol=1e-4, atol=1e-6):
    raise UserError(f"{culprit}: removing the final softmax of layer '{layer.name}' changed"
                    " more than the softmax; return logits")
  return stripped


def _look_like_probabilities(outputs: np.ndarray) -> bool:
  return bool(np.all(outputs >= 0) and np.allclose(outputs.sum(axis=-1), 1.0, atol=1e-4))


def _softmax(logits: np.ndarray) -> np.ndarray:
  z = np.exp(logits - logits.max(axis=-1, keepdims=True))
  return z / z.sum(axis=-1, keepdims=True)
