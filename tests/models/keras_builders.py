"""Tiny Keras builders for the `keras` model entry, named as
`tests.models.keras_builders:<function>` in test configs."""

from __future__ import annotations

import tensorflow as tf

CALLS = []  # keyword arguments of every call, newest last


def dense(input_shape, num_classes, hidden=0, dropout=0.0, softmax="none", outputs=None):
  """Flatten, optional ReLU hidden layer and dropout, dense output.

  `softmax`: "none" (logits), "dense" (the output layer's activation),
  "activation" (an Activation layer) or "layer" (a Softmax layer).
  """
  CALLS.append(dict(input_shape=input_shape, num_classes=num_classes, hidden=hidden,
                    dropout=dropout, softmax=softmax, outputs=outputs))
  layers = [tf.keras.Input(input_shape), tf.keras.layers.Flatten()]
  if hidden:
    layers.append(tf.keras.layers.Dense(hidden, activation="relu"))
  if dropout:
    layers.append(tf.keras.layers.Dropout(dropout))
  activation = "softmax" if softmax == "dense" else None
  layers.append(tf.keras.layers.Dense(outputs or num_classes, activation=activation))
  if softmax == "activation":
    layers.append(tf.keras.layers.Activation("softmax"))
  elif softmax == "layer":
    layers.append(tf.keras.layers.Softmax())
  return tf.keras.Sequential(layers)


def functional_softmax(input_shape, num_classes):
  """A functional model: Dense logits, then a Softmax layer."""
  x = tf.keras.Input(input_shape)
  logits = tf.keras.layers.Dense(num_classes)(tf.keras.layers.Flatten()(x))
  return tf.keras.Model(x, tf.keras.layers.Softmax()(logits))


def lambda_softmax(input_shape, num_classes):
  """Ends in a softmax fedsim cannot see (inside a Lambda)."""
  return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Flatten(),
                              tf.keras.layers.Dense(num_classes),
                              tf.keras.layers.Lambda(tf.nn.softmax)])


def batch_norm(input_shape, num_classes):
  return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Flatten(),
                              tf.keras.layers.Dense(4),
                              tf.keras.layers.BatchNormalization(name="bn"),
                              tf.keras.layers.Dense(num_classes)])


def frozen(input_shape, num_classes):
  fixed = tf.keras.layers.Dense(4, name="fixed")
  fixed.trainable = False
  return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Flatten(), fixed,
                              tf.keras.layers.Dense(num_classes)])


def regularized(input_shape, num_classes):
  return tf.keras.Sequential([
      tf.keras.Input(input_shape), tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(num_classes, name="decayed",
                            kernel_regularizer=tf.keras.regularizers.L2(0.1))])


class Subclassed(tf.keras.Model):

  def __init__(self, num_classes):
    super().__init__()
    self.out = tf.keras.layers.Dense(num_classes)

  def call(self, x):
    return self.out(tf.keras.layers.Flatten()(x))


def subclassed(input_shape, num_classes):
  del input_shape
  return Subclassed(num_classes)


class Reversed(tf.keras.layers.Layer):
  """Two dense layers, tracked as (second, first) but built first-then-second.

  Keras lists its weights in tracking order, TFF in creation order: a model
  with this layer tells whether fedsim maps one onto the other.
  """

  def __init__(self, units=5, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.second = tf.keras.layers.Dense(units, name="second")
    self.first = tf.keras.layers.Dense(units, activation="relu", name="first")

  def call(self, x):
    return self.second(self.first(x))

  def get_config(self):
    return {**super().get_config(), "units": self.units}


def reversed_weights(input_shape, num_classes):
  return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Flatten(),
                              Reversed(5), tf.keras.layers.Dense(num_classes, name="head")])


def sequence(input_shape, num_classes):
  """Token ids [batch, T] -> [batch, num_classes]: wrong for next-token data."""
  return tf.keras.Sequential([tf.keras.Input(input_shape, dtype=tf.int32),
                              tf.keras.layers.Embedding(num_classes, 4),
                              tf.keras.layers.GlobalAveragePooling1D(),
                              tf.keras.layers.Dense(num_classes)])


def raises(input_shape, num_classes):
  raise ValueError("width must be positive\nsecond line")


def not_a_model(input_shape, num_classes):
  return [tf.keras.layers.Dense(num_classes)]
