"""Client work that trains locally and sends the change of the model it received.

The client work of FedAvg, FedProx and FedBuff: each client trains the received
weights w to w_i and sends Delta_i = w - w_i with its weight (examples, or 1).
Its clients keep state when they keep their optimizer state or carry a partial
accumulation window over; anything else a client keeps (an upload encoder's
residual) wraps this work from outside (`fedsim.compression.feedback`).
"""

from __future__ import annotations

import collections
from typing import Callable

import numpy as np
import tensorflow as tf

from fedsim.learning.client_work import (ClientWork, build_client_work,
                                         build_stateful_client_work, empty_window_arrays,
                                         window_state)


def model_delta_client_work(task, optimizer, uniform_weighting: bool, accumulation=None,
                            keep_optimizer_state: bool = False,
                            extra_gradient: Callable | None = None) -> ClientWork:
  """Client work that trains locally and sends `received - trained` weights.

  Args:
    task: the `Task` (model, batch size).
    optimizer: the client's `tff.learning.optimizers.Optimizer`.
    uniform_weighting: every client weighs 1 instead of its examples.
    accumulation: a `local_training.Accumulation` (None: one batch a step).
    keep_optimizer_state: each client keeps its optimizer state (momentum,
      Adam's moments and step) across the rounds it takes part in, as coMind's
      FedAvg workers keep their optimizer slots; False starts it fresh.
    extra_gradient: `received weights -> (weights -> gradient)`, a term added
      to every batch gradient (FedProx's proximal pull), or None.

  Returns:
    The ClientWork (its `model_delta` set); stateful (client state kept by the
    run loop) when optimizer state is kept or accumulation carries a partial
    window over.
  """
  from fedsim.learning import local_training
  from fedsim.learning.optimizers import state_as_arrays, stored_or_initial
  accumulation = accumulation or local_training.Accumulation()
  predict = task.model.predict
  trainable = task.model.initial_weights.trainable
  specs = tuple(tf.TensorSpec(w.shape, w.dtype) for w in trainable)
  data_type = task.model.client_data_type(task.batch_size)

  def train(model_weights, batches, optimizer_state, window):
    received = tuple(model_weights.trainable)
    result = local_training.train(
        predict, optimizer, received, optimizer_state, batches, accumulation,
        extra_gradient(received) if extra_gradient is not None else None,
        task.model.pad_label, window)
    delta = tuple(r - t for r, t in zip(received, result.weights))
    weight = tf.constant(1.0) if uniform_weighting else result.stats.num_examples
    return delta, weight, result

  if not (keep_optimizer_state or accumulation.carry):
    def update_fn(model_weights, batches):
      delta, weight, result = train(model_weights, batches, optimizer.initialize(specs), None)
      return delta, weight, result.stats
    return build_client_work(task.model.weights_type, data_type, update_fn, model_delta=True)

  initial = collections.OrderedDict(initialized=np.float32(0.0))
  if keep_optimizer_state:
    initial["optimizer_state"] = state_as_arrays(optimizer, specs)
  if accumulation.carry:
    initial["window"] = empty_window_arrays(trainable)

  def stateful_update_fn(model_weights, batches, client_state):
    fresh = tf.nest.map_structure(tf.convert_to_tensor, optimizer.initialize(specs))
    optimizer_state = (stored_or_initial(client_state["initialized"] > 0,
                                         client_state["optimizer_state"], fresh)
                       if keep_optimizer_state else fresh)
    window = client_state["window"] if accumulation.carry else None
    delta, weight, result = train(model_weights, batches, optimizer_state, window)
    new_state = collections.OrderedDict(initialized=tf.constant(1.0))
    if keep_optimizer_state:
      new_state["optimizer_state"] = result.optimizer_state
    if accumulation.carry:
      new_state["window"] = window_state(result.window)
    return delta, weight, result.stats, new_state

  return build_stateful_client_work(task.model.weights_type, data_type, initial,
                                    stateful_update_fn, model_delta=True)
