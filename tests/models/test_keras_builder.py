"""`model: {name: keras, builder: ..., args: ...}`, `register_model`, and each refusal."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import fedsim.models
from fedsim.config.typed import Component, parse
from fedsim.errors import UserError
from fedsim.models import MODELS
from fedsim.models.functional import build_task_model
from tests.models import keras_builders

B = "tests.models.keras_builders"


def keras_spec(builder, **args):
  data = {"name": "keras", "builder": builder, **({"args": args} if args else {})}
  return Component("keras", parse(MODELS.get("keras").params, {
      k: v for k, v in data.items() if k != "name"}, "model"))


def test_builder_gets_data_shape_classes_and_args():
  model = build_task_model(keras_spec(f"{B}:dense", hidden=4), (2, 3), 5, seed=0)
  assert keras_builders.CALLS[-1] == dict(input_shape=(2, 3), num_classes=5, hidden=4,
                                          dropout=0.0, softmax="none", outputs=None)
  assert [w.shape for w in model.initial_weights.trainable] == [(6, 4), (4,), (4, 5), (5,)]
  assert model.num_params == 6 * 4 + 4 + 4 * 5 + 5


def test_config_round_trips_and_initial_weights_is_omitted_unless_set():
  spec = keras_spec(f"{B}:dense", hidden=4)
  assert spec.to_dict() == {"name": "keras", "builder": f"{B}:dense", "args": {"hidden": 4}}
  assert "initial_weights" not in Component("mlp", parse(MODELS.get("mlp").params, {})).to_dict()


ERRORS = [
    ("nowhere_at_all:make", {},
     "model.builder: cannot import module 'nowhere_at_all' (No module named 'nowhere_at_all')"),
    (f"{B}:missing", {}, f"model.builder: module '{B}' has no function 'missing'"),
    ("tests.models.broken_module:make", {},
     "model.builder: importing 'tests.models.broken_module' raised RuntimeError: broken on purpose"),
    (f"{B}:raises", {}, f"model.builder: {B}:raises raised ValueError: width must be positive"),
    (f"{B}:dense", {"widht": 3},
     f"model.builder: {B}:dense raised TypeError: dense() got an unexpected keyword argument"
     " 'widht'"),
    (f"{B}:not_a_model", {}, f"model.builder: {B}:not_a_model returned list, not a tf.keras.Model"),
    (f"{B}:dense", {"outputs": 5},
     f"model.builder: {B}:dense: the model returns outputs of shape [batch, 5]; fedsim needs"
     " logits of shape [batch, 3] (one per class of the data)"),
    (f"{B}:batch_norm", {},
     f"model.builder: {B}:batch_norm: layer 'bn' keeps non-trainable weights (moving_mean,"
     " moving_variance), which federated training does not update; use GroupNormalization"
     " or LayerNormalization"),
    (f"{B}:frozen", {},
     f"model.builder: {B}:frozen: layer 'fixed' keeps non-trainable weights (kernel, bias),"
     " which federated training does not update; make the layer trainable or remove it"),
    (f"{B}:regularized", {},
     f"model.builder: {B}:regularized: layer 'decayed' adds a loss term (a kernel, bias or"
     " activity regularizer, or add_loss), which fedsim's training leaves out; remove it"),
    (f"{B}:subclassed", {},
     f"model.builder: {B}:subclassed: a subclassed Keras model cannot be cloned, which TFF's"
     " functional models need; build it with tf.keras.Sequential or"
     " tf.keras.Model(inputs, outputs)"),
    (f"{B}:lambda_softmax", {},
     f"model.builder: {B}:lambda_softmax: the model's outputs look like probabilities (they"
     " sum to 1), but fedsim finds no final softmax to remove (a softmax activation of the"
     " output layer or a Softmax layer at the end); return logits"),
]


@pytest.mark.parametrize("builder, args, message", ERRORS,
                         ids=[e[0].split(":")[-1] + str(len(e[1])) for e in ERRORS])
def test_each_refusal_is_one_line_naming_the_key(builder, args, message):
  with pytest.raises(UserError) as info:
    build_task_model(keras_spec(builder, **args), (3,), 3, seed=0)
  assert str(info.value) == message


def test_sequence_data_needs_logits_per_position():
  with pytest.raises(UserError) as info:
    build_task_model(keras_spec(f"{B}:sequence"), (6,), 3, seed=0, x_dtype=np.int32,
                     label_shape=(6,))
  assert str(info.value) == (
      f"model.builder: {B}:sequence: the model returns outputs of shape [batch, 3]; fedsim"
      " needs logits of shape [batch, 6, 3] (one per class of the data)")


@pytest.mark.parametrize("data, message", [
    ({"builder": "mylab"}, "model.builder: expected 'package.module:function', got 'mylab'"),
    ({}, "model.builder: missing required key"),
    ({"builder": "a:b", "args": {"num_classes": 3}},
     "model.args: num_classes come from the data; remove them from args"),
    ({"builder": "a:b", "args": [1]}, "model.args: expected a mapping, got [1]"),
    ({"builder": "a:b", "initial_weights": "no/such/file.npz"},
     "model.initial_weights: no such file 'no/such/file.npz'"),
])
def test_config_errors_at_parse_time(data, message):
  with pytest.raises(UserError) as info:
    parse(MODELS.get("keras").params, data, "model")
  assert str(info.value) == message


@pytest.mark.parametrize("name", sorted(MODELS.names()))
def test_every_model_takes_initial_weights(name, tmp_path):
  path = tmp_path / "w.npz"
  np.savez(path, a=np.zeros(1))
  data = {"initial_weights": str(path), **({"builder": "a:b"} if name == "keras" else {})}
  assert parse(MODELS.get(name).params, data, "model").initial_weights == str(path)


@dataclasses.dataclass(frozen=True)
class WideParams:
  width: int = 4

  def check(self, key):
    if self.width < 1:
      raise UserError(f"{key}.width: must be >= 1")


@pytest.fixture
def registered():
  names = []
  yield names
  for name in names:
    MODELS._entries.pop(name, None)  # pylint: disable=protected-access


def test_register_model_is_public_and_replaceable(registered):
  registered.append("test_wide")

  @fedsim.models.register_model("test_wide", params=WideParams)
  def wide(params, input_shape, num_classes):
    return keras_builders.dense(input_shape, num_classes, hidden=params.width)

  params = parse(MODELS.get("test_wide").params, {"width": 7}, "model")
  assert isinstance(params, WideParams) and params.width == 7
  with pytest.raises(UserError, match=r"^model.width: must be >= 1$"):
    parse(MODELS.get("test_wide").params, {"width": 0}, "model")
  model = build_task_model(Component("test_wide", params), (3,), 2, seed=0)
  assert [w.shape for w in model.initial_weights.trainable] == [(3, 7), (7,), (7, 2), (2,)]

  def other(params, input_shape, num_classes):
    return wide(params, input_shape, num_classes)

  with pytest.raises(ValueError, match="model 'test_wide' is already registered"):
    fedsim.models.register_model("test_wide", params=WideParams)(other)
  fedsim.models.register_model("test_wide", params=WideParams, replace=True)(other)
  assert MODELS.get("test_wide").build is other


def test_register_model_refuses_params_it_cannot_extend():
  @dataclasses.dataclass
  class Mutable:
    width: int = 4

  @dataclasses.dataclass(frozen=True)
  class Clash:
    initial_weights: str = ""

  with pytest.raises(TypeError, match="must be a frozen dataclass"):
    fedsim.models.register_model("test_mutable", params=Mutable)
  with pytest.raises(TypeError, match=r"may not define \['initial_weights'\]"):
    fedsim.models.register_model("test_clash", params=Clash)
