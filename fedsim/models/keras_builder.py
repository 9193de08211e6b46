"""`keras`: the user's own Keras model, named by import path.

    model:
      name: keras
      builder: "mylab.models:make"   # importable from the working directory
      args: {width: 128}             # passed on as keyword arguments

The builder is imported when the model is built (not when the config is
validated) and called as

    make(input_shape=(8, 8), num_classes=10, width=128)

with the shape of one example (no batch axis) and the class count of the
dataset. It returns an uncompiled `tf.keras.Sequential` or functional
`tf.keras.Model`; what fedsim then checks and adapts (output shape, a final
softmax, non-trainable weights) is in `fedsim/models/keras_checks.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedsim.errors import UserError
from fedsim.models import MODELS, first_line
from fedsim.registry import resolve


@dataclasses.dataclass(frozen=True)
class KerasParams:
  builder: str  # "package.module:function"
  args: dict[str, Any] = dataclasses.field(default_factory=dict)  # keyword arguments

  def check(self, key: str) -> None:
    module, _, name = self.builder.partition(":")
    if not module or not name:
      raise UserError(f"{key}.builder: expected 'package.module:function', got"
                      f" '{self.builder}'")
    taken = {"input_shape", "num_classes"} & set(self.args)
    if taken:
      raise UserError(f"{key}.args: {', '.join(sorted(taken))} come from the data;"
                      " remove them from args")

  def culprit(self) -> str:
    """How errors about the built model name it."""
    return f"model.builder: {self.builder}"


@MODELS.register("keras", params=KerasParams)
def build_keras(params: KerasParams, input_shape, num_classes):
  """Your own Keras model: `builder(input_shape=..., num_classes=..., **args)`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  fn = resolve(params.builder, key="model")
  try:
    model = fn(input_shape=tuple(input_shape), num_classes=num_classes, **params.args)
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"model.builder: {params.builder} raised {type(e).__name__}:"
                    f" {first_line(e)}") from None
  if not isinstance(model, tf.keras.Model):
    raise UserError(f"model.builder: {params.builder} returned {type(model).__name__},"
                    " not a tf.keras.Model")
  return model
