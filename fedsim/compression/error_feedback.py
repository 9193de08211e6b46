"""Error feedback on the upload (Seide et al. 2014; Karimireddy et al. 2019, EF-SGD).

Each client keeps a residual e (what its encoder dropped). When sampled it
sends C(u + e) and keeps e <- (u + e) - C(u + e). fedsim's encoders are pure
functions of the values encoded, the run seed and the tensor's flat index
(`noise_seeds.noise_seed`), so a client can compute C(u + e) itself
with the encoder the aggregation will use and hand u + e to the aggregation,
which encodes it to the very same bits. No encoded value crosses the wire
twice; the residual never leaves the client.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from fedsim.compression import DirectionSpec, upload_feedback  # noqa: F401  (re-exported)
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.encoders import encoder_for


def _decode_one(x: tf.Tensor, spec: DirectionSpec, seed: int, index: int) -> tf.Tensor:
  """C(x) for the tensor at flat `index`, built as `mean.build_encoded_sum` builds it."""
  tensor_spec = tf.TensorSpec(x.shape, x.dtype)
  with te_api.noise_key(seed, index):
    encoder = te_api.gather_encoder(encoder_for(tensor_spec, spec), tensor_spec)
  encode_params, before_sum_params, after_sum_params = encoder.get_params(
      encoder.initial_state())
  encoded, _ = encoder.encode(x, encode_params)
  part = encoder.decode_before_sum(encoded, before_sum_params)
  return encoder.decode_after_sum(part, after_sum_params, 1)


def local_decode(value: Any, spec: DirectionSpec | None, seed: int) -> Any:
  """C(value): what the server decodes from this client's encoded `value`.

  Call inside a TensorFlow computation. Tensors are indexed in `tf.nest`
  order, as TFF's encoded sum indexes them; encoders whose state changes
  between rounds would break the equality (fedsim's registered ones are
  stateless).

  Args:
    value: a structure of float tensors (the value the aggregation encodes).
    spec: the `encode` stage's direction; None decodes to `value` itself.
    seed: the run seed (`StageContext.seed`).

  Returns:
    The decoded structure, same shapes and dtypes.
  """
  if spec is None:
    return value
  flat = tf.nest.flatten(value)
  return tf.nest.pack_sequence_as(
      value, [_decode_one(x, spec, seed, i) for i, x in enumerate(flat)])


def feedback_step(update: Any, residual: Any, spec: DirectionSpec | None,
                  seed: int) -> tuple[Any, Any, Any]:
  """One client's error-feedback step (TensorFlow).

  Returns:
    (sent, decoded, new_residual): sent = update + residual, the value to
    hand to the aggregation; decoded = C(sent), what the server will decode;
    new_residual = sent - decoded.
  """
  sent = tf.nest.map_structure(tf.add, update, residual)
  decoded = local_decode(sent, spec, seed)
  return sent, decoded, tf.nest.map_structure(tf.subtract, sent, decoded)


def weighted_feedback_step(update: Any, residual: Any, weight: Any, spec: DirectionSpec,
                           seed: int, weighted: bool) -> tuple[Any, Any]:
  """`feedback_step` for a client whose update a mean aggregates (TensorFlow).

  A weighted mean (TFF's `MeanFactory`) encodes weight * value, multiplied
  as TFF multiplies it, so the client decodes that and divides the weight
  back out; the residual stays in update units. A client of weight 0 sends
  nothing and keeps all of update + residual.

  Returns:
    (sent, new_residual): the value to hand to the aggregation, and what the
    client keeps.
  """
  sent = tf.nest.map_structure(tf.add, update, residual)
  if not weighted:
    decoded = local_decode(sent, spec, seed)
  else:
    scaled = tf.nest.map_structure(lambda x: x * tf.cast(weight, x.dtype), sent)
    decoded = tf.nest.map_structure(
        lambda d: tf.math.divide_no_nan(d, tf.cast(weight, d.dtype)),
        local_decode(scaled, spec, seed))
  return sent, tf.nest.map_structure(tf.subtract, sent, decoded)


def residual_sums(residual: Any) -> dict:
  """One client's contributions to the error-feedback measurements
  (TensorFlow): its new residual's L2 norm and a count of 1."""
  norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(r)) for r in tf.nest.flatten(residual)]))
  return {"residual_norm": norm, "clients": tf.constant(1.0)}


def finalize_sums(sums: dict) -> dict:
  """Summed `residual_sums` -> `residual_norm`, the mean over aggregated clients."""
  return {"residual_norm": sums["residual_norm"] / tf.maximum(sums["clients"], 1.0)}
