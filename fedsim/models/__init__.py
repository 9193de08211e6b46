"""Models by name. Each builder returns an uncompiled Keras model.

Builders take `(params, input_shape, num_classes)`; the input shape comes from
the dataset, so one `cnn` entry serves 28x28x1 EMNIST and 8x8 digits alike.
"""

from __future__ import annotations

import dataclasses

from fedsim.config.typed import bounded
from fedsim.registry import NoParams, Registry

MODELS = Registry("model")


@dataclasses.dataclass(frozen=True)
class MlpParams:
  hidden: list[int] = dataclasses.field(default_factory=lambda: [200, 200])
  activation: str = "relu"

  def check(self, key: str) -> None:
    from fedsim.errors import UserError
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
    from fedsim.errors import UserError
    if not self.units or any(u < 1 for u in self.units):
      raise UserError(f"{key}.units: need one or more LSTM sizes >= 1, got {self.units}")


@dataclasses.dataclass(frozen=True)
class CnnGnParams:
  filters: list[int] = dataclasses.field(default_factory=lambda: [32, 64, 128])  # per stage
  groups: int = bounded(8, min=1)  # group-norm groups (gcd with the stage's filters)

  def check(self, key: str) -> None:
    from fedsim.errors import UserError
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
