"""Noise seeds of fedsim's encoding stages (pure TensorFlow and NumPy).

Every random draw of a fedsim stage (stochastic rounding, rotation signs,
random-k coordinates) is a stateless draw seeded by `noise_seed(x, salt)`:
the 64-bit fingerprint of the values `x` being encoded XOR a 64-bit salt,
with the round folded in when the encoding runs inside `noise_round(r)`. The
salt is `SeedSequence([run seed, tensor index])` and is
fixed when the stage is built (`noise_key(run_seed, tensor_index)` around the
encoder builder; the tensor index is its position in the flattened value).
The round is a counter in the encode stage's server state (sent to clients
with the encoder parameters for an upload). So noise is a pure function of
(run seed, round, tensor, values): runs repeat bit for bit, a different run
seed gives different noise, and the same values encoded in two rounds draw
different noise. Inside TFF's aggregation a client does not know its id; its
values stand in for it (two clients sending identical values in one round
draw identical noise). A user stage that draws noise should do the same:
take `salt_or_current(None)` in its constructor and seed its stateless draws
with `noise_seed(x, salt)` (both also importable from
`fedsim.compression.tensor_encoding_api`).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import numpy as np
import tensorflow as tf


_NOISE_KEY: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar(
    "fedsim_noise_key", default=(0, 0))


@contextlib.contextmanager
def noise_key(run_seed: int, tensor_index: int) -> Iterator[None]:
  """Stages built inside this block salt their noise with (run_seed, tensor_index)."""
  token = _NOISE_KEY.set((int(run_seed), int(tensor_index)))
  try:
    yield
  finally:
    _NOISE_KEY.reset(token)


_NOISE_ROUND: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "fedsim_noise_round", default=None)


@contextlib.contextmanager
def noise_round(round_index: Any) -> Iterator[None]:
  """Stages *encoding* inside this block fold `round_index` (an int32 scalar,
  tensor or int; None: no round) into their noise seeds (see `noise_seed`)."""
  token = _NOISE_ROUND.set(round_index)
  try:
    yield
  finally:
    _NOISE_ROUND.reset(token)


def noise_salt(run_seed: int | None = None, tensor_index: int = 0) -> np.ndarray:
  """int32[2]: the salt of (run_seed, tensor_index); both None: the current `noise_key`.

  The salt is the first 64 bits of NumPy's `SeedSequence([run_seed mod 2**64,
  tensor_index])`, so nearby seeds give unrelated salts.
  """
  if run_seed is None:
    run_seed, tensor_index = _NOISE_KEY.get()
  words = np.random.SeedSequence([run_seed % 2**64, tensor_index]).generate_state(2, np.uint32)
  return words.view(np.int32)


def _fingerprint_seed(x: tf.Tensor) -> tf.Tensor:
  """int32[2]: the 8 bytes of a fingerprint of `x`'s values."""
  fingerprint = tf.fingerprint(tf.reshape(x, [1, -1]))   # uint8[1, 8]
  return tf.bitcast(tf.reshape(fingerprint, [2, 4]), tf.int32)


def noise_seed(x: tf.Tensor, salt: Any) -> tf.Tensor:
  """int32[2], a stateless-RNG seed: the fingerprint of `x`'s values XOR `salt`,
  with the current `noise_round` folded in (`stateless_fold_in`) if one is set.

  Seeding with the values encoded makes encoding a pure function (same run,
  same bits: reruns and resumed checkpoints match), while clients' updates,
  which differ, draw unrelated noise; the salt (see `noise_salt`) brings in
  the run seed and the tensor, the round makes a value repeated in a later
  round draw new noise.
  """
  seed = tf.bitwise.bitwise_xor(_fingerprint_seed(x), tf.cast(salt, tf.int32))
  round_index = _NOISE_ROUND.get()
  if round_index is None:
    return seed
  return tf.random.experimental.stateless_fold_in(seed, tf.cast(round_index, tf.int32))


def stage_salt(salt: Any, position: int) -> np.ndarray:
  """int32[2]: the salt of the stage at `position` in a chain whose salt is
  `salt` (so two stages of one chain draw unrelated noise)."""
  words = np.asarray(salt).astype(np.int64) % 2**32
  state = np.random.SeedSequence([*words.tolist(), position]).generate_state(2, np.uint32)
  return state.view(np.int32)


def params_seed(salt: Any) -> tf.Tensor:
  """int32[2], a stateless-RNG seed for a stage's per-round parameters: `salt`
  with the current `noise_round` folded in if one is set (no values: every
  client and the server see the same parameters)."""
  seed = tf.cast(salt, tf.int32)
  round_index = _NOISE_ROUND.get()
  if round_index is None:
    return seed
  return tf.random.experimental.stateless_fold_in(seed, tf.cast(round_index, tf.int32))


def salt_or_current(salt: Any) -> Any:
  """`salt` if given (an int32[2] array or tensor), else the current `noise_key`'s salt."""
  return noise_salt() if salt is None else salt
