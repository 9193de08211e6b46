"""Optimizers by name, built on TFF's functional optimizers.

TFF's optimizers keep their state as plain tensors (`initialize` / `next`),
so client and server optimizer state is data that can be carried between
rounds (elastic averaging) and checkpointed.
"""

from __future__ import annotations

import dataclasses

from fedsim.config.typed import bounded
from fedsim.registry import Registry

OPTIMIZERS = Registry("optimizer")


def build_optimizer(spec):
  """The `tff.learning.optimizers.Optimizer` of a parsed `optimizer` Component."""
  return OPTIMIZERS.get(spec.name).build(spec.params)


@dataclasses.dataclass(frozen=True)
class SgdParams:
  learning_rate: float = bounded(0.1, gt=0)
  momentum: float = bounded(0.0, min=0, max=1)


@dataclasses.dataclass(frozen=True)
class AdamParams:
  learning_rate: float = bounded(0.001, gt=0)
  beta_1: float = bounded(0.9, min=0, max=1)
  beta_2: float = bounded(0.999, min=0, max=1)
  epsilon: float = bounded(1e-7, gt=0)


@dataclasses.dataclass(frozen=True)
class RmsPropParams:
  learning_rate: float = bounded(0.01, gt=0)
  decay: float = bounded(0.9, min=0, max=1)
  epsilon: float = bounded(1e-7, gt=0)


@dataclasses.dataclass(frozen=True)
class AdagradParams:
  learning_rate: float = bounded(0.1, gt=0)
  initial_accumulator_value: float = bounded(0.1, min=0)
  epsilon: float = bounded(1e-7, gt=0)


@OPTIMIZERS.register("sgd", params=SgdParams)
def build_sgd(p: SgdParams):
  """SGD, with optional heavy-ball momentum."""
  import tensorflow_federated as tff
  momentum = p.momentum if p.momentum > 0 else None
  return tff.learning.optimizers.build_sgdm(learning_rate=p.learning_rate, momentum=momentum)


@OPTIMIZERS.register("adam", params=AdamParams)
def build_adam(p: AdamParams):
  """Adam (Kingma & Ba 2015)."""
  import tensorflow_federated as tff
  return tff.learning.optimizers.build_adam(
      learning_rate=p.learning_rate, beta_1=p.beta_1, beta_2=p.beta_2, epsilon=p.epsilon)


@OPTIMIZERS.register("rmsprop", params=RmsPropParams)
def build_rmsprop(p: RmsPropParams):
  """RMSProp."""
  import tensorflow_federated as tff
  return tff.learning.optimizers.build_rmsprop(
      learning_rate=p.learning_rate, decay=p.decay, epsilon=p.epsilon)


@OPTIMIZERS.register("adagrad", params=AdagradParams)
def build_adagrad(p: AdagradParams):
  """Adagrad."""
  import tensorflow_federated as tff
  return tff.learning.optimizers.build_adagrad(
      learning_rate=p.learning_rate,
      initial_preconditioner_value=p.initial_accumulator_value, epsilon=p.epsilon)


def advance_iterations(state, count):
  """`state` with its iteration count advanced by `count` (a float tensor).

  Only optimizers with bias correction count iterations (TFF's Adam, AdamW
  and Yogi keep it as `step`); the others' state is returned unchanged.
  """
  import tensorflow as tf
  if not (isinstance(state, dict) and "step" in state):
    return state
  step = tf.convert_to_tensor(state["step"])
  advanced = type(state)(state)
  advanced["step"] = step + tf.cast(count, step.dtype)
  return advanced


def state_as_arrays(optimizer, specs):
  """The optimizer's initial state for weights of `specs`, as NumPy arrays.

  TFF keeps hyperparameters as Python numbers; as arrays the state has one
  fixed type, on disk (client states) and in TFF computations.
  """
  import numpy as np
  import tensorflow as tf
  return tf.nest.map_structure(lambda v: np.asarray(tf.convert_to_tensor(v)),
                               optimizer.initialize(specs))


def stored_or_initial(seen, stored, initial):
  """`stored` where `seen` (a bool tensor) holds, else `initial`: the same nested
  structure of tensors (e.g. a client's optimizer state, or its local model)."""
  import tensorflow as tf
  stored = tf.nest.pack_sequence_as(initial, tf.nest.flatten(stored))
  return tf.nest.map_structure(lambda s, i: tf.where(seen, s, tf.cast(i, s.dtype)),
                               stored, initial)
