"""Models by name. Each builder returns an uncompiled Keras model.

Builders take `(params, input_shape, num_classes)`; the input shape comes from
the dataset, so one `cnn` entry serves 28x28x1 EMNIST and 8x8 digits alike.
Every entry also takes `initial_weights: PATH.npz` (see `CommonModelParams`),
and `keras` (fedsim/models/keras_builder.py) builds the user's own model.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

from fedsim.config.plain import to_plain
from fedsim.config.typed import bounded
from fedsim.errors import UserError
from fedsim.registry import NoParams, Registry


class CommonModelParams:
  """Keys that every model entry takes besides its own (added after them).

  `initial_weights`: an .npz file (such as a run's final_model.npz) to start
  from instead of the seeded initialization; checked when the model is built.
  """

  FIELDS = {"initial_weights": (str | None, None)}  # name: (type, default)

  def check_common(self, key: str) -> None:
    if self.initial_weights is not None and not os.path.isfile(
        os.path.expanduser(self.initial_weights)):
      raise UserError(f"{key}.initial_weights: no such file '{self.initial_weights}'")

  def to_dict(self) -> dict:
    out = {f.name: to_plain(getattr(self, f.name)) for f in dataclasses.fields(self)
           if f.init and f.name not in self.FIELDS}
    if self.initial_weights is not None:  # Configs that never set it stay as they were.
      out["initial_weights"] = self.initial_weights
    return out


def _with_common_params(params: type) -> type:
  """`params` plus the keys of `CommonModelParams`, one frozen dataclass."""
  if isinstance(params, type) and issubclass(params, CommonModelParams):
    return params  # Another entry's params, already extended.
  if not dataclasses.is_dataclass(params) or not params.__dataclass_params__.frozen:
    raise TypeError(f"model params {getattr(params, '__name__', params)} must be a frozen"
                    " dataclass")
  clash = {f.name for f in dataclasses.fields(params)} & set(CommonModelParams.FIELDS)
  if clash:
    raise TypeError(f"model params {params.__name__} may not define {sorted(clash)}:"
                    " every model takes them already")
  own_check = getattr(params, "check", None)

  def check(self, key: str) -> None:
    if own_check is not None:
      own_check(self, key)
    self.check_common(key)

  namespace = {"check": check, "__module__": params.__module__,
               "__qualname__": params.__qualname__, "__doc__": params.__doc__,
               "__annotations__": {n: t for n, (t, _) in CommonModelParams.FIELDS.items()}}
  for name, (_, default) in CommonModelParams.FIELDS.items():
    namespace[name] = dataclasses.field(default=default, kw_only=True)
  return dataclasses.dataclass(frozen=True)(
      type(params.__name__, (params, CommonModelParams), namespace))


def first_line(error: BaseException) -> str:
  """The first line of `error`'s message ('' if it has none), for one-line UserErrors."""
  text = str(error).strip()
  return text.splitlines()[0] if text else ""


class ModelRegistry(Registry):
  """A registry whose entries all take `CommonModelParams` besides their own."""

  def register(self, name: str, params: type = NoParams, replace: bool = False):
    return super().register(name, _with_common_params(params), replace)


MODELS = ModelRegistry("model")


def register_model(name: str, params: type = NoParams, replace: bool = False) -> Callable:
  """Decorator that adds a model, selectable as `model: {name: NAME, ...}` in config.

  The decorated function is called as `fn(params, input_shape, num_classes)`:
  `params` is an instance of `params` (a frozen dataclass, built from the
  model section's other keys, plus `initial_weights`), `input_shape` the
  shape of one example without the batch axis (a tuple, from the dataset) and
  `num_classes` the dataset's class count. It returns an uncompiled
  `tf.keras.Sequential` or functional `tf.keras.Model` whose output is logits
  `[batch, num_classes]` (`[batch, T, num_classes]` for sequence data); a
  final softmax is removed for training (see docs/guides/own-model.md).
  Import TensorFlow inside the function, not at module level.

  Example:

    @dataclasses.dataclass(frozen=True)
    class WideParams:
      width: int = 256

    @fedsim.models.register_model("wide", params=WideParams)
    def wide(params, input_shape, num_classes):
      import tensorflow as tf
      return tf.keras.Sequential([
          tf.keras.Input(input_shape), tf.keras.layers.Flatten(),
          tf.keras.layers.Dense(params.width, activation="relu"),
          tf.keras.layers.Dense(num_classes)])

  and in the config: `model: {name: wide, width: 512}`. `replace=True`
  re-registers a taken name (a notebook cell run twice).

  Returns:
    The decorator; it returns the function unchanged.

  Raises:
    TypeError: if `params` is not a frozen dataclass, or defines a key that
      every model already takes (`initial_weights`).
    ValueError: if another function is already registered under `name` and
      `replace` is false.
  """
  return MODELS.register(name, params=params, replace=replace)


@dataclasses.dataclass(frozen=True)
class MlpParams:
  hidden: list[int] = dataclasses.field(default_factory=lambda: [200, 200])
  activation: str = "relu"

  def check(self, key: str) -> None:
    if any(h < 1 for h in self.hidden):
      raise UserError(f"{key}.hidden: layer sizes must be >= 1, got {self.hidden}")
    if self.activation not in ("relu", "tanh", "sigmoid", "elu", "gelu"):
      raise UserError(f"{key}.activation: must be one of relu, tanh, sigmoid, elu,"
                      f" gelu; got '{self.activation}'")


@dataclasses.dataclass(frozen=True)
class CnnParams:
  filters: tuple[int, int] = (32, 64)
  dense: int = bounded(512, min=1)


@dataclasses.dataclass(frozen=True)
class LstmParams:
  embedding: int = bounded(8, min=1)  # embedding width per token
  units: list[int] = dataclasses.field(default_factory=lambda: [256, 256])  # per LSTM layer

  def check(self, key: str) -> None:
    if not self.units or any(u < 1 for u in self.units):
      raise UserError(f"{key}.units: need one or more LSTM sizes >= 1, got {self.units}")


@dataclasses.dataclass(frozen=True)
class CnnGnParams:
  filters: list[int] = dataclasses.field(default_factory=lambda: [32, 64, 128])  # per stage
  groups: int = bounded(8, min=1)  # group-norm groups (gcd with the stage's filters)

  def check(self, key: str) -> None:
    if not self.filters or any(f < 1 for f in self.filters):
      raise UserError(f"{key}.filters: need one or more filter counts >= 1, got {self.filters}")


@MODELS.register("mlp", params=MlpParams)
def build_mlp(params: MlpParams, input_shape, num_classes):
  """Fully connected ReLU network; McMahan et al.'s 2NN is hidden [200, 200] on 784 inputs."""
  from fedsim.models import keras_models
  return keras_models.mlp(input_shape, num_classes, params.hidden, params.activation)


@MODELS.register("logistic", params=NoParams)
def build_logistic(params, input_shape, num_classes):
  """Multinomial logistic regression (one dense softmax layer)."""
  from fedsim.models import keras_models
  return keras_models.mlp(input_shape, num_classes, [], "relu")


@MODELS.register("cnn", params=CnnParams)
def build_cnn(params: CnnParams, input_shape, num_classes):
  """CNN of McMahan et al. 2017: 2x (5x5 conv + 2x2 max-pool), dense 512, softmax."""
  from fedsim.models import keras_models
  return keras_models.cnn(input_shape, num_classes, params.filters, params.dense)


@MODELS.register("lstm", params=LstmParams)
def build_lstm(params: LstmParams, input_shape, num_classes):
  """Next-token LSTM (TFF's Shakespeare char model by default): embedding, LSTMs, dense."""
  from fedsim.models import keras_models
  return keras_models.lstm(input_shape, num_classes, params.embedding, params.units)


@MODELS.register("cnn_gn", params=CnnGnParams)
def build_cnn_gn(params: CnnGnParams, input_shape, num_classes):
  """Small CNN with group norm for colour images such as CIFAR-100 (no batch norm)."""
  from fedsim.models import keras_models
  return keras_models.cnn_gn(input_shape, num_classes, params.filters, params.groups)


from fedsim.models import keras_builder  # noqa: E402,F401  (registers `keras`)
