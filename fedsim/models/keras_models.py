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


def lstm(input_shape, num_classes: int, embedding: int, units) -> tf.keras.Model:
  """Token ids [batch, T] -> next-token logits [batch, T, num_classes].

  Input and output share one vocabulary of `num_classes` tokens, as in TFF's
  Shakespeare model (McMahan et al. 2017). No input masking: fedsim's data pads
  only at sequence ends, and a masked LSTM's state bookkeeping buys nothing there.
  """
  if len(input_shape) != 1:
    raise ValueError(f"lstm needs token sequences [T], got input shape {tuple(input_shape)}")
  layers = [tf.keras.layers.InputLayer(input_shape=tuple(input_shape), dtype=tf.int32),
            tf.keras.layers.Embedding(num_classes, embedding)]
  layers += [tf.keras.layers.LSTM(u, return_sequences=True, kernel_initializer="he_normal")
             for u in units]
  layers.append(tf.keras.layers.Dense(num_classes))  # logits per position
  return tf.keras.Sequential(layers)


def cnn_gn(input_shape, num_classes: int, filters, groups: int) -> tf.keras.Model:
  """Per stage: 3x3 conv, group norm, ReLU, 2x2 max-pool; then global average, dense.

  Group norm (Hsieh et al. 2020) instead of batch norm: its scale and offset
  are trainable and it keeps no running statistics, so the functional
  training loop sees every weight.
  """
  if len(input_shape) != 3:
    raise ValueError(f"cnn_gn needs images [height, width, channels], got {tuple(input_shape)}")
  layers = [tf.keras.layers.InputLayer(input_shape=tuple(input_shape))]
  for f in filters:
    layers += [
        tf.keras.layers.Conv2D(f, 3, padding="same", use_bias=False),
        tf.keras.layers.GroupNormalization(groups=math.gcd(groups, f)),
        tf.keras.layers.ReLU(),
        tf.keras.layers.MaxPool2D(2, padding="same"),
    ]
  layers += [tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(num_classes)]
  return tf.keras.Sequential(layers)
