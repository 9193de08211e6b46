"""Small builders for process-level tests."""

from __future__ import annotations

from fedsim.aggregation import parse_aggregation, parse_broadcast
from fedsim.algorithms import ALGORITHMS, Task
from fedsim.config.typed import Component, parse
from fedsim.models import MODELS
from fedsim.models.functional import build_task_model


def task_model(model="logistic", input_shape=(3,), num_classes=2, seed=0, **model_params):
  entry = MODELS.get(model)
  return build_task_model(Component(model, parse(entry.params, model_params)),
                          input_shape, num_classes, seed)


def algorithm(name, params, model, batch_size=2, epochs=1, compression=None,
              aggregation=(), broadcast=(), clients_per_round=1, seed=0, num_clients=0):
  """The algorithm `name` built for `model`.

  `compression` is a parsed `compression:` section (its shorthand: a final
  `encode` stage per direction); `aggregation` / `broadcast` are chains as
  written in a config (lists of stage mappings).
  """
  entry = ALGORITHMS.get(name)
  aggregation, broadcast = parse_aggregation(list(aggregation)), parse_broadcast(list(broadcast))
  if getattr(compression, "aggregation", None) is not None:
    aggregation += (Component("encode", compression.aggregation),)
  if getattr(compression, "broadcast", None) is not None:
    broadcast = (Component("encode", compression.broadcast),)
  return entry.build(parse(entry.params, params, "algorithm"),
                     Task(model=model, batch_size=batch_size, epochs=epochs,
                          aggregation=aggregation, broadcast=broadcast,
                          clients_per_round=clients_per_round, seed=seed,
                          num_clients=num_clients))
