"""Keras definitions of the registered models (imports TensorFlow)."""

from __future__ import annotations

import math

import tensorflow as tf


def mlp(input_shape, num_classes: int, hidden, activation: str) -> tf.keras.Model:
  layers = [tf.keras.layers.InputLayer(input_shape=tuple(input_shape))]
  if len(input_shape) > 1:
    layers.append(tf.keras.layers.Flatten())
  layers += [tf.keras.layers.Dense(h, activation=activation) for h in hidden]
  layers.append(tf.keras.layers.Dense(num_classes))  # logits
  return tf.keras.Sequential(layers)


def cnn(input_shape, num_classes: int, filters, dense: int) -> tf.keras.Model:
  shape = tuple(input_shape)
  if len(shape) == 1:  # flat features such as the 8x8 digits: make a square image
    side = math.isqrt(shape[0])
    if side * side != shape[0]:
      raise ValueError(f"cnn needs image input, got flat features of size {shape[0]}")
    shape = (side, side, 1)
  layers = [tf.keras.layers.InputLayer(input_shape=tuple(input_shape))]
  if shape != tuple(input_shape):
    layers.append(tf.keras.layers.Reshape(shape))
  for f in filters:
    layers += [
        tf.keras.layers.Conv2D(f, 5, padding="same", activation="relu"),
        tf.keras.layers.MaxPool2D(2, padding="same"),
    ]
  layers += [
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(dense, activation="relu"),
      tf.keras.layers.Dense(num_classes),  # logits
  ]
  return tf.keras.Sequential(layers)
