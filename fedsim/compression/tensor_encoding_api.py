"""fedsim's one doorway to tensor_encoding.

tensor_encoding lives under tfmot's `internal` package and TFF 0.88 deleted
both `tff.aggregators.EncodedSumFactory` and the tfmot dependency, so every
use of tensor_encoding is kept in this module: an upgrade rewrites this file
only. fedsim's encoded sum (`fedsim.compression.encoded_sum`) is its own,
built on TFF's public intrinsics, so that deletion does not touch it.

User encoders (see `fedsim.compression.register_encoder`) may use the names
re-exported here: `stages` (built-in encoding stages), `EncodingStageInterface`
and `tf_style_encoding_stage` (to write a stage), `Encoder` and `chain`.
`SeededUniformQuantizationStage` and `SeededHadamardStage` replace the
built-in stages of the same kind where a run must repeat: tensor_encoding's
draw unseeded random numbers inside the computation.

Noise seeds. Every random draw of a fedsim stage (stochastic rounding,
rotation signs, random-k coordinates) is a stateless draw seeded by
`noise_seed(x, salt)`: the 64-bit fingerprint of the values `x` being encoded
XOR a 64-bit salt, with the round folded in when the encoding runs inside
`noise_round(r)`. The salt is `SeedSequence([run seed, tensor index])` and is
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
with `noise_seed(x, salt)`.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
from typing import Any, Iterator

import numpy as np
import tensorflow as tf
from tensorflow_model_optimization.python.core.internal import tensor_encoding as te
from tensorflow_model_optimization.python.core.internal.tensor_encoding.utils import tf_utils

Encoder = te.core.Encoder
EncodingStageInterface = te.core.EncodingStageInterface
AdaptiveEncodingStageInterface = te.core.AdaptiveEncodingStageInterface
tf_style_encoding_stage = te.core.tf_style_encoding_stage
stages = te.stages

_STAGE_TYPES = (EncodingStageInterface, AdaptiveEncodingStageInterface)


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


def salt_or_current(salt: Any) -> Any:
  """`salt` if given (an int32[2] array or tensor), else the current `noise_key`'s salt."""
  return noise_salt() if salt is None else salt


class SeededUniformQuantizationStage(te.stages.UniformQuantizationEncodingStage):
  """`UniformQuantizationEncodingStage` whose stochastic rounding is seeded.

  tensor_encoding draws the rounding noise with unseeded `tf.random.uniform`.
  Here the noise is `tf.random.stateless_uniform` seeded by `noise_seed(x,
  salt)`: encoding the same tensor twice gives the same output. Rounding
  still goes up with probability equal to the remainder, so over different
  inputs it stays unbiased. Same encoded tensors and bits as the parent.
  `salt` (int32[2]) defaults to the current `noise_key`'s.
  """

  def __init__(self, bits=8, min_max=None, stochastic=True, salt=None):
    super().__init__(bits, min_max, stochastic)
    self._salt = salt_or_current(salt)

  def encode(self, x, encode_params, name=None):
    if not self._stochastic:
      return super().encode(x, encode_params, name)
    with tf.name_scope(name or f"{self.name}_encode"):
      x = tf.convert_to_tensor(x)
      encode_params = tf.nest.map_structure(tf.convert_to_tensor, encode_params)
      seed = noise_seed(x, self._salt)
      if self.MIN_MAX_VALUES_KEY in encode_params:
        min_max = tf.cast(encode_params[self.MIN_MAX_VALUES_KEY], x.dtype)
        low, high = min_max[0], min_max[1]
        x = tf.clip_by_value(x, low, high)
      else:
        low, high = tf.reduce_min(x), tf.reduce_max(x)
      levels = tf.cast(encode_params[self.MAX_INT_VALUE_PARAMS_KEY], x.dtype)
      # On [0, levels]; all zeros when low == high.
      scaled = tf.math.divide_no_nan(x - low, high - low) * levels
      floored = tf.floor(scaled)
      noise = tf.random.stateless_uniform(tf.shape(scaled), seed, dtype=x.dtype)
      rounded_up = tf.cast(noise < scaled - floored, x.dtype)
      encoded = collections.OrderedDict([(self.ENCODED_VALUES_KEY, floored + rounded_up)])
      if self.MIN_MAX_VALUES_KEY not in encode_params:
        encoded[self.MIN_MAX_VALUES_KEY] = tf.stack([low, high])
      return encoded


class SeededHadamardStage(te.stages.HadamardEncodingStage):
  """`HadamardEncodingStage` whose random signs are seeded by its input.

  tensor_encoding draws the seed in `get_params` with unseeded
  `tf.random.uniform` (on the server, sent to every client for a mean). Here
  `encode` takes it from `noise_seed(x, salt)` and sends it along as int32[2]
  (64 bits) under `seed`, and `decode` reads it from there. Clients thus
  rotate with different signs, so the rotation no longer commutes with sum:
  the server undoes each client's rotation before summing.
  """

  def __init__(self, salt=None):
    super().__init__()
    self._salt = salt_or_current(salt)

  @property
  def commutes_with_sum(self):
    return False

  def get_params(self, name=None):
    del name  # The seed comes with the encoded value.
    return collections.OrderedDict(), collections.OrderedDict()

  def encode(self, x, encode_params, name=None):
    del encode_params  # Empty.
    with tf.name_scope(name or f"{self.name}_encode"):
      x = self._validate_and_expand_encode_input(tf.convert_to_tensor(x))
      seed = noise_seed(x, self._salt)
      signed = x * self._random_signs(x.shape.as_list()[1], seed, x.dtype)
      rotated = tf_utils.fast_walsh_hadamard_transform(self._pad(signed))
      return collections.OrderedDict([(self.ENCODED_VALUES_KEY, rotated),
                                      (self.SEED_PARAMS_KEY, seed)])

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None, name=None):
    del decode_params, num_summands  # Unused: each decode undoes one rotation.
    with tf.name_scope(name or f"{self.name}_decode"):
      rotated = tf.convert_to_tensor(encoded_tensors[self.ENCODED_VALUES_KEY])
      shape = tf.convert_to_tensor(shape)
      unrotated = tf_utils.fast_walsh_hadamard_transform(rotated)
      # Drop the zero padding: keep the input's last dimension.
      decoded = tf.slice(unrotated, [0, 0], [tf.shape(unrotated)[0], shape[-1]])
      decoded *= self._random_signs(decoded.shape.as_list()[-1],
                                    encoded_tensors[self.SEED_PARAMS_KEY], decoded.dtype)
      if shape.shape.num_elements() == 1:
        decoded = tf.squeeze(decoded, [0])
      return decoded


class SeededKashinStage(te.stages.research.KashinHadamardEncodingStage):
  """`KashinHadamardEncodingStage` whose random signs are seeded by its input.

  As `SeededHadamardStage`: the seed is `noise_seed(x, salt)`, sent with the
  coefficients as int32[2] (64 bits), so the stage no longer commutes with sum.
  Kashin's representation (Lyubarskii & Vershynin 2010) spreads the vector
  over a redundant frame (m coefficients: the size padded to a power of two,
  doubled when that pads by less than 15%), each clipped to about
  `norm / sqrt(delta * m)`: quantizing them loses little to outliers.
  """

  def __init__(self, eta=0.9, delta=1.0, num_iters=3, last_iter_clip=False,
               pad_extra_level_threshold=0.85, salt=None):
    super().__init__(eta=eta, delta=delta, num_iters=num_iters, last_iter_clip=last_iter_clip,
                     pad_extra_level_threshold=pad_extra_level_threshold)
    self._salt = salt_or_current(salt)

  @property
  def commutes_with_sum(self):
    return False

  def get_params(self, name=None):
    del name  # The seed comes with the encoded value.
    encode_params, _ = super().get_params()
    del encode_params[self.SEED_PARAMS_KEY]
    return encode_params, collections.OrderedDict()

  def encode(self, x, encode_params, name=None):
    with tf.name_scope(name or f"{self.name}_encode"):
      x = tf.convert_to_tensor(x)
      seed = noise_seed(x, self._salt)
      params = collections.OrderedDict(encode_params)
      params[self.SEED_PARAMS_KEY] = seed
      encoded = super().encode(x, params)
      encoded[self.SEED_PARAMS_KEY] = seed
      return encoded

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None, name=None):
    del decode_params  # The seed comes with the encoded value.
    with tf.name_scope(name or f"{self.name}_decode"):
      values = collections.OrderedDict(
          [(self.ENCODED_VALUES_KEY, encoded_tensors[self.ENCODED_VALUES_KEY])])
      seed = collections.OrderedDict(
          [(self.SEED_PARAMS_KEY, encoded_tensors[self.SEED_PARAMS_KEY])])
      return super().decode(values, seed, num_summands, shape)


def _pin_static_shape(tensor: tf.Tensor) -> tf.Tensor:
  """`tensor` through an EnsureShape op carrying the shape Python infers for it.

  `Tensor.set_shape` (which tensor_encoding uses after its `tf.while_loop`s)
  only annotates the Python graph; TFF serializes the graph and re-runs the C++
  shape inference, which loses such shapes. An EnsureShape op records the
  shape in the GraphDef, so it survives.
  """
  if tensor.shape.rank is None:
    return tensor
  return tf.ensure_shape(tensor, tensor.shape)


def _wrapped_property(name: str) -> property:
  """A read-only property returning the wrapped stage's (`self._stage`) `name`."""
  return property(lambda self: getattr(self._stage, name))


class _StaticShapeStage(EncodingStageInterface):
  """An encoding stage whose encoded and decoded tensors keep their static shapes.

  Without this, the Hadamard rotation's output (shaped by `set_shape` after a
  `tf.while_loop`) is [None, d] once TFF has re-imported the graph, and bit
  packing's zero padding then leaves int32[None, 1], which TFF rejects against
  the type it recorded (e.g. int32[4682, 1]). In tensor_encoding 0.7.5 the
  8-bit packer hides this by slicing to a constant size when the padded length
  is 1, 2 or 3 mod 7 (32768, 65536) but not 4 mod 7 (2048, 16384, 131072);
  other widths but 6 and 12 fail at every size.
  """

  def __init__(self, stage: EncodingStageInterface):
    self._stage = stage

  name = _wrapped_property("name")
  compressible_tensors_keys = _wrapped_property("compressible_tensors_keys")
  commutes_with_sum = _wrapped_property("commutes_with_sum")
  decode_needs_input_shape = _wrapped_property("decode_needs_input_shape")

  # `name` as in `tf_style_encoding_stage`, which tensor_encoding's adaptive
  # wrapper passes on.
  def get_params(self, name=None):
    return self._stage.get_params(name)

  def encode(self, x, encode_params, name=None):
    encoded = self._stage.encode(x, encode_params, name)
    return type(encoded)((k, _pin_static_shape(v)) for k, v in encoded.items())

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None, name=None):
    return _pin_static_shape(
        self._stage.decode(encoded_tensors, decode_params, num_summands, shape, name))


def _with_static_shapes(stage: Any) -> Any:
  """`stage` wrapped in `_StaticShapeStage`; an adaptive stage is returned as is."""
  if isinstance(stage, EncodingStageInterface):
    return _StaticShapeStage(stage)
  return stage


def chain(*encoding_stages: Any) -> Encoder:
  """An `Encoder` applying `encoding_stages` in order, each to its parent's output.

  Every stage but the last must have exactly one compressible output (e.g.
  flatten -> rotate -> quantize -> bitpack); the next stage encodes that one.
  Each (non-adaptive) stage's outputs keep the static shapes Python infers for
  them when TFF re-imports the graph (see `_StaticShapeStage`).

  Raises:
    ValueError: if no stage is given or a non-final stage has zero or several
      compressible outputs.
  """
  if not encoding_stages:
    raise ValueError("chain() needs at least one encoding stage")
  encoding_stages = [_with_static_shapes(s) for s in encoding_stages]
  composer = te.core.EncoderComposer(encoding_stages[-1])
  for parent in reversed(encoding_stages[:-1]):
    keys = list(parent.compressible_tensors_keys)
    if len(keys) != 1:
      raise ValueError(f"stage '{parent.name}' has compressible outputs {keys};"
                       " only a stage with exactly one can be chained")
    composer = composer.add_parent(parent, keys[0])
  return composer.make()


def identity_encoder() -> Encoder:
  """An `Encoder` that sends the tensor unchanged."""
  return te.encoders.identity()


def quantization_encoder(bits: int, stochastic: bool, rotate: bool) -> Encoder:
  """Flatten, optional randomized Hadamard rotation, uniform quantization, bit packing.

  Quantization maps [min, max] of the (rotated) vector onto 2**bits - 1 equal
  steps; min and max travel with the packed values as two floats. Packing
  writes the values' bits back to back, 28 to an int32 (so that a varint stays
  4 bytes): about bits * 32 / 28 bits per element on the wire.
  The rotation pads the vector with zeros to the next power of two; its signs'
  seed (int32[2], 64 bits) travels with the encoded value. Random draws are
  seeded by `noise_seed` (the values encoded, salted with the run seed and the
  tensor's index), so encoding is a pure function.
  """
  steps = [stages.FlattenEncodingStage()]
  if rotate:
    steps.append(SeededHadamardStage())
  steps.append(SeededUniformQuantizationStage(bits, stochastic=stochastic))
  steps.append(stages.BitpackingEncodingStage(bits))
  return chain(*steps)


def as_encoder(built: Any) -> Encoder:
  """`built` as an `Encoder`: an Encoder is kept, a single encoding stage is wrapped.

  Raises:
    TypeError: if `built` is neither.
  """
  if isinstance(built, Encoder):
    return built
  if isinstance(built, _STAGE_TYPES):
    return chain(built)
  raise TypeError("an encoder builder must return a tensor_encoding Encoder or"
                  f" encoding stage, got {type(built).__name__}")


def simple_encoder(encoder: Encoder, spec: tf.TensorSpec) -> te.core.SimpleEncoder:
  """`encoder` bound to one tensor spec for one-to-many use (server -> clients)."""
  return te.encoders.as_simple_encoder(encoder, spec)


def gather_encoder(encoder: Encoder, spec: tf.TensorSpec) -> te.core.GatherEncoder:
  """`encoder` bound to one tensor spec for many-to-one use (clients -> server)."""
  return te.encoders.as_gather_encoder(encoder, spec)


def _packing_bits(stage: Any) -> int | None:
  """The input bits of a bit-packing stage under fedsim's and tensor_encoding's
  wrappers, or None if `stage` does not pack bits."""
  while True:
    if isinstance(stage, te.stages.BitpackingEncodingStage):
      return stage._input_bits   # pylint: disable=protected-access
    inner = stage.__dict__.get("_wrapped_stage") or stage.__dict__.get("_stage")
    if inner is None:
      return None
    stage = inner


def _without_packing(encoder: Encoder) -> tuple[Encoder, dict[str, int]]:
  """`encoder` with its bit-packing leaves removed, and the bits each packed (by key path)."""
  children, bits = {}, {}
  for key, child in encoder.children.items():
    packed = _packing_bits(child.stage)
    if packed is not None and not child.children:
      bits[key] = packed
    else:
      children[key], inner = _without_packing(child)
      bits.update({f"{key}/{k}": b for k, b in inner.items()})
  return te.core.Encoder(encoder.stage, children), bits


BITPACKED_KEY = te.stages.BitpackingEncodingStage.ENCODED_VALUES_KEY
_PACKED_TO = 28   # bits of each int32 that bit packing fills


def packing_layout(encoder: Encoder, spec: tf.TensorSpec) -> list[tuple[str, int, int | None]]:
  """(path, bits, count) of each bit-packed output of `encoder` on a `spec` tensor.

  `path` is the slash-joined key path of the packed tensor in the encoded
  structure (its key ends with `path/BITPACKED_KEY`), `bits` the bits per
  symbol and `count` how many symbols it packs (None when that depends on
  the values). Traced, not run: no noise is drawn.
  """
  unpacked, bits = _without_packing(encoder)
  if not bits:
    return []

  def encode(x):
    encode_params, _ = unpacked.get_params(unpacked.initial_state())
    encoded, _, _ = unpacked.encode(x, encode_params)
    return {path: _find(encoded, path) for path in bits}

  shapes = tf.function(encode).get_concrete_function(
      tf.TensorSpec(spec.shape, spec.dtype)).structured_outputs
  return [(path, b, shapes[path].shape.num_elements()) for path, b in bits.items()]


def unpack_symbols(words: tf.Tensor, bits: int, count: int) -> tf.Tensor:
  """int32[count]: the `bits`-bit symbols bit packing wrote into the int32 `words`."""
  return tf.reshape(tf_utils.unpack_from_int(words, bits, _PACKED_TO, [count]), [-1])


def _find(tree, path: str):
  for key in path.split("/"):
    tree = tree[key]
  return tree


def packed_symbols(encoder: Encoder, x: tf.Tensor) -> list[tuple[tf.Tensor, int]]:
  """(symbols, bits) of every bit-packed output of encoding `x` with `encoder`.

  The symbols are what bit packing would write (integers in [0, 2**bits), as
  floats), drawn with the same noise as encoding `x` under the same
  `noise_key`; [] if `encoder` packs nothing.
  """
  unpacked, bits = _without_packing(encoder)
  if not bits:
    return []
  encode_params, _ = unpacked.get_params(unpacked.initial_state())
  encoded, _, _ = unpacked.encode(x, encode_params)
  return [(_find(encoded, path), b) for path, b in bits.items()]
