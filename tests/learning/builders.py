"""Small builders for process-level tests."""

from __future__ import annotations

from fedsim.algorithms import ALGORITHMS, Task
from fedsim.config.typed import Component, parse
from fedsim.models import MODELS
from fedsim.models.functional import build_task_model


def task_model(model="logistic", input_shape=(3,), num_classes=2, seed=0, **model_params):
  entry = MODELS.get(model)
  return build_task_model(Component(model, parse(entry.params, model_params)),
                          input_shape, num_classes, seed)


def algorithm(name, params, model, batch_size=2, epochs=1, compression=None):
  entry = ALGORITHMS.get(name)
  return entry.build(parse(entry.params, params, "algorithm"),
                     Task(model=model, batch_size=batch_size, epochs=epochs,
                          compression=compression))
