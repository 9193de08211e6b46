"""fedsim's one doorway to tensor_encoding.

tensor_encoding lives under tfmot's `internal` package and TFF 0.88 deleted
both `tff.aggregators.EncodedSumFactory` and the tfmot dependency, so
tensor_encoding is imported, and its internals read, in this module only: an
upgrade rewrites this file (other modules use the names it exports). fedsim's
encoded sum (`fedsim.compression.encoded_sum`) is its own, built on TFF's
public intrinsics, so that deletion does not touch it.

User encoders (see `fedsim.compression.register_encoder`) may use the names
re-exported here: `stages` (built-in encoding stages), `EncodingStageInterface`
and `tf_style_encoding_stage` (to write a stage; `AdaptiveEncodingStageInterface`,
`tf_style_adaptive_encoding_stage` and `StateAggregationMode` for one with
server state, as `stages.low_rank`), `Encoder` and `chain`.
tensor_encoding's stages draw unseeded random numbers inside the computation;
fedsim seeds those draws (`seeded`, which `chain` applies and fedsim applies
to every `Encoder` a registered builder returns, however it was composed), so
a user's encoder of them repeats and decodes what it encoded on every runtime. fedsim's own encoders
use `SeededUniformQuantizationStage`, `SeededHadamardStage` and `SeededKashinStage`
instead (the rotations with signs of each client's own, sent with its value):
they live here, not in `fedsim.compression.stages`, because they override
tensor_encoding's private methods and read its `tf_utils`. Their noise
seeds are `fedsim.compression.noise_seeds`' (`noise_key`, `noise_round`,
`noise_seed`, `salt_or_current`, re-exported here for user stages). What a bit-packing
stage writes is read here (`packing_bits`, `unpack_symbols`) and analysed in
`fedsim.compression.bit_packing`; the built-in encoders are registered in
`fedsim.compression.encoder_catalog` and assembled in `fedsim.compression.encoders`.
An encoder is bound to one tensor here: for the broadcast by fedsim's own
`SimpleEncoder` (tensor_encoding's interface, its ops made inline), for uploads by
tensor_encoding's `GatherEncoder`.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import itertools
from typing import Any

import tensorflow as tf
from tensorflow_model_optimization.python.core.internal import tensor_encoding as te
from tensorflow_model_optimization.python.core.internal.tensor_encoding.utils import tf_utils

from fedsim.compression.noise_seeds import (noise_key, noise_round,  # noqa: F401 (re-exported)
                                            noise_salt, noise_seed, params_seed,
                                            salt_or_current, stage_salt)

Encoder = te.core.Encoder
EncodingStageInterface = te.core.EncodingStageInterface
AdaptiveEncodingStageInterface = te.core.AdaptiveEncodingStageInterface
tf_style_encoding_stage = te.core.tf_style_encoding_stage
tf_style_adaptive_encoding_stage = te.core.tf_style_adaptive_encoding_stage
StateAggregationMode = te.core.StateAggregationMode
# A gather encoder's encoded dict keys its root stage's tensors "tensors/KEY".
ROOT_TENSORS_PREFIX = "tensors/"
stages = te.stages


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


# The seed stream of the stage call in progress: [int32[2] seed, draws so far].
_STAGE_DRAWS: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "fedsim_stage_draws", default=None)
_UNSEEDED = {"uniform": tf.random.uniform, "normal": tf.random.normal,
             "truncated_normal": tf.random.truncated_normal}


def _next_seed() -> tf.Tensor | None:
  """The stream's next int32[2] seed (draw n gets the seed with n folded in), or
  None outside a seeded stage call (another thread tracing meanwhile)."""
  stream = _STAGE_DRAWS.get()
  if stream is None:
    return None
  seed, count = stream
  stream[1] += 1
  return tf.random.experimental.stateless_fold_in(seed, count)


def _seeded_uniform(shape, minval=0, maxval=None, dtype=tf.float32, seed=None, name=None):
  stream_seed = _next_seed()
  if stream_seed is None:
    return _UNSEEDED["uniform"](shape, minval, maxval, dtype, seed, name)
  dtype = tf.as_dtype(dtype)
  if maxval is None:
    if dtype.is_integer:
      raise ValueError(f"Must specify maxval for integer dtype {dtype!r}")
    maxval = 1
  return tf.random.stateless_uniform(shape, stream_seed, minval, maxval, dtype, name=name)


def _seeded_normal(shape, mean=0.0, stddev=1.0, dtype=tf.float32, seed=None, name=None):
  stream_seed = _next_seed()
  if stream_seed is None:
    return _UNSEEDED["normal"](shape, mean, stddev, dtype, seed, name)
  return tf.random.stateless_normal(shape, stream_seed, mean, stddev, dtype, name=name)


def _seeded_truncated_normal(shape, mean=0.0, stddev=1.0, dtype=tf.float32, seed=None,
                             name=None):
  stream_seed = _next_seed()
  if stream_seed is None:
    return _UNSEEDED["truncated_normal"](shape, mean, stddev, dtype, seed, name)
  return tf.random.stateless_truncated_normal(shape, stream_seed, mean, stddev, dtype, name=name)


_SEEDED = {"uniform": _seeded_uniform, "normal": _seeded_normal,
           "truncated_normal": _seeded_truncated_normal}


@contextlib.contextmanager
def _seeded_draws(seed: tf.Tensor):
  """Within the block, this thread's `tf.random.uniform`, `tf.random.normal` and
  `tf.random.truncated_normal` draw statelessly from `seed` (the n-th draw
  with n folded in). Other random ops (`tf.random.shuffle`, a
  `tf.random.Generator`, raw ops) are not seeded here:
  `fedsim.compression.check` stops a plugin encoder whose draws do not repeat.

  tensor_encoding's stages draw with those unseeded stateful ops: a Hadamard
  or Kashin rotation's seed in `get_params`, stochastic rounding's noise and a
  PRNG quantizer's seed in `encode`. Unseeded, a round split into
  MapReduceForm phases draws the rotation's seed once in `prepare` (sent to
  the clients) and again in `update` (the server's decode), so the server
  undoes a rotation the clients never made; runs cannot repeat either.
  """
  token = _STAGE_DRAWS.set([seed, 0])
  for name, seeded_op in _SEEDED.items():
    setattr(tf.random, name, seeded_op)
  try:
    yield
  finally:
    for name, unseeded_op in _UNSEEDED.items():
      setattr(tf.random, name, unseeded_op)
    _STAGE_DRAWS.reset(token)


class _ChainedStage(EncodingStageInterface):
  """A stage as fedsim runs it: seeded draws, static shapes.

  Its random draws are seeded (see `_seeded_draws`): `get_params`' from
  `params_seed(salt)`, the same on the server and every client of a round;
  `encode`'s from `noise_seed(x, salt)`, as fedsim's own stages draw. The
  salt is the encoder's (the run seed and the tensor's index, see
  `noise_seeds`) with the stage's position in the encoder. Its encoded and
  decoded tensors keep the static shapes Python infers for them: without
  this, the Hadamard rotation's output (shaped by `set_shape` after a
  `tf.while_loop`) is [None, d] once TFF has re-imported the graph, and bit
  packing's zero padding then leaves int32[None, 1], which TFF rejects against
  the type it recorded (e.g. int32[4682, 1]). In tensor_encoding 0.7.5 the
  8-bit packer hides this by slicing to a constant size when the padded length
  is 1, 2 or 3 mod 7 (32768, 65536) but not 4 mod 7 (2048, 16384, 131072);
  other widths but 6 and 12 fail at every size.
  """

  def __init__(self, stage: EncodingStageInterface, salt: Any):
    self._stage = stage
    self._salt = salt

  name = _wrapped_property("name")
  compressible_tensors_keys = _wrapped_property("compressible_tensors_keys")
  commutes_with_sum = _wrapped_property("commutes_with_sum")
  decode_needs_input_shape = _wrapped_property("decode_needs_input_shape")

  # `name` as in `tf_style_encoding_stage`, which tensor_encoding's adaptive
  # wrapper passes on.
  def get_params(self, name=None):
    with _seeded_draws(params_seed(self._salt)):
      return self._stage.get_params(name)

  def encode(self, x, encode_params, name=None):
    with _seeded_draws(noise_seed(x, self._salt)):
      encoded = self._stage.encode(x, encode_params, name)
    return type(encoded)((k, _pin_static_shape(v)) for k, v in encoded.items())

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None, name=None):
    return _pin_static_shape(
        self._stage.decode(encoded_tensors, decode_params, num_summands, shape, name))


class _ChainedAdaptiveStage(AdaptiveEncodingStageInterface):
  """An adaptive stage (one with server state) as fedsim runs it: as
  `_ChainedStage`, and its state's draws (`initial_state`, `update_state`)
  seeded from a salt of its own. Other attributes (e.g. a stage's
  `UPDATES_IN_ENCODED`) are the wrapped stage's."""

  def __init__(self, stage: AdaptiveEncodingStageInterface, salt: Any):
    self._stage = stage
    self._salt = salt
    self._state_salt = stage_salt(salt, 0)

  def __getattr__(self, attr):
    if attr.startswith("__") or attr in ("_stage", "_salt", "_state_salt"):
      raise AttributeError(attr)  # not set yet (copy, pickle): no recursion
    return getattr(self._stage, attr)

  name = _wrapped_property("name")
  compressible_tensors_keys = _wrapped_property("compressible_tensors_keys")
  commutes_with_sum = _wrapped_property("commutes_with_sum")
  decode_needs_input_shape = _wrapped_property("decode_needs_input_shape")
  state_update_aggregation_modes = _wrapped_property("state_update_aggregation_modes")

  # tensor_encoding's `Encoder` calls an adaptive stage's methods without
  # `name`, which a stage not decorated with `tf_style_adaptive_encoding_stage`
  # does not take: it is passed on only when given.
  def initial_state(self, name=None):
    with _seeded_draws(params_seed(self._state_salt)):
      if name is None:
        return self._stage.initial_state()
      return self._stage.initial_state(name)

  def update_state(self, state, state_update_tensors, name=None):
    with _seeded_draws(params_seed(self._state_salt)):
      if name is None:
        return self._stage.update_state(state, state_update_tensors)
      return self._stage.update_state(state, state_update_tensors, name)

  def get_params(self, state, name=None):
    with _seeded_draws(params_seed(self._salt)):
      if name is None:
        return self._stage.get_params(state)
      return self._stage.get_params(state, name)

  def encode(self, x, encode_params, name=None):
    with _seeded_draws(noise_seed(x, self._salt)):
      if name is None:
        encoded, state_update_tensors = self._stage.encode(x, encode_params)
      else:
        encoded, state_update_tensors = self._stage.encode(x, encode_params, name)
    return (type(encoded)((k, _pin_static_shape(v)) for k, v in encoded.items()),
            state_update_tensors)

  def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None, name=None):
    if name is None:
      decoded = self._stage.decode(encoded_tensors, decode_params, num_summands, shape)
    else:
      decoded = self._stage.decode(encoded_tensors, decode_params, num_summands, shape, name)
    return _pin_static_shape(decoded)


_WRAPPED = (_ChainedStage, _ChainedAdaptiveStage)


def _as_chained(stage: Any, salt: Any) -> Any:
  """`stage` wrapped in `_ChainedStage` (`_ChainedAdaptiveStage` if adaptive);
  a stage fedsim already wraps is returned as is."""
  # tensor_encoding's `Encoder` holds a plain stage inside a stateless adaptive shell.
  inner = stage.__dict__.get("_wrapped_stage") if isinstance(
      stage, te.core.encoding_stage.NoneStateAdaptiveEncodingStage) else None
  if inner is not None:
    stage = inner
  if isinstance(stage, _WRAPPED):
    return stage
  if isinstance(stage, EncodingStageInterface):
    return _ChainedStage(stage, salt)
  return _ChainedAdaptiveStage(stage, salt)


def seeded(encoder: Encoder) -> Encoder:
  """`encoder` with each stage's random draws seeded and its shapes pinned (see
  `_ChainedStage`), however it was composed (`chain`, tensor_encoding's
  `EncoderComposer` or `te.encoders.*`): every random draw of a stage in
  `tf.random.uniform`, `normal` or `truncated_normal` then depends on the
  current `noise_key` (the run seed and the tensor's index), the round, the
  stage's position in the encoder (depth first, children by key) and, in
  `encode`, the values encoded. Stages already seeded keep their seeds.
  """
  salt = salt_or_current(None)
  positions = itertools.count()

  def rebuild(node: Encoder) -> Encoder:
    stage = _as_chained(node.stage, stage_salt(salt, next(positions)))
    children = {key: rebuild(node.children[key]) for key in sorted(node.children)}
    return te.core.Encoder(stage, children)

  return rebuild(encoder)


def chain(*encoding_stages: Any) -> Encoder:
  """An `Encoder` applying `encoding_stages` in order, each to its parent's output.

  Every stage but the last must have exactly one compressible output (e.g.
  flatten -> rotate -> quantize -> bitpack); the next stage encodes that one.
  Each stage's random draws are seeded by the current `noise_key` (the run
  seed and the tensor's index, set while fedsim builds an encoder), the
  round and its position in the chain, and its outputs keep the static
  shapes Python infers for them (see `seeded`).

  Raises:
    ValueError: if no stage is given or a non-final stage has zero or several
      compressible outputs.
  """
  if not encoding_stages:
    raise ValueError("chain() needs at least one encoding stage")
  composer = te.core.EncoderComposer(encoding_stages[-1])
  for parent in reversed(encoding_stages[:-1]):
    keys = list(parent.compressible_tensors_keys)
    if len(keys) != 1:
      raise ValueError(f"stage '{parent.name}' has compressible outputs {keys};"
                       " only a stage with exactly one can be chained")
    composer = composer.add_parent(parent, keys[0])
  return seeded(composer.make())


def identity_encoder() -> Encoder:
  """An `Encoder` that sends the tensor unchanged."""
  return te.encoders.identity()


class SimpleEncoder:
  """`encoder` bound to one tensor spec for one-to-many use (the server encodes,
  every client decodes), its ops made where it is called.

  The interface of tensor_encoding's `SimpleEncoder`: `initial_state()` (a
  tuple of tensors), `encode(x, state=None) -> (encoded, new_state)` and
  `decode(encoded)`, where `encoded` is a flat dict of what is sent (the
  encoded tensors, the decode parameters and the input shapes not known
  statically) keyed by their slash-joined paths, under the same keys. Its
  Python values (e.g. static shapes) stay here for `decode`, so a value is
  encoded (or traced) before one is decoded. tensor_encoding's class traces
  three `tf.function`s when it is made, through AutoGraph, and again in every
  TFF computation that calls them. With this, a process's first build of a
  run with a broadcast encoder takes ~40% less CPU and later ones ~12% less,
  with the same weights bit for bit (bench/broadcast_encoders.py). The ops
  are the same.
  """

  def __init__(self, encoder: Encoder, spec: tf.TensorSpec):
    if not isinstance(encoder, Encoder):
      raise TypeError(f"an Encoder is needed, got {type(encoder).__name__}")
    if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
      raise TypeError(f"a tf.TensorSpec of a known shape is needed, got {spec}")
    self.input_tensorspec = spec
    self._encoder = encoder
    self._state_structure = None   # the encoder's nested state, None at its leaves
    self._sent_structure = None    # everything `encode` returns, None at its leaves
    self._python_values = None     # its non-tensor values, as a nested dict

  def initial_state(self) -> tuple:
    state = self._encoder.initial_state()
    self._state_structure = tf.nest.map_structure(lambda _: None, state)
    return tuple(tf.nest.flatten(state))

  def encode(self, x, state: tuple | None = None) -> tuple[dict, tuple]:
    if state is None or self._state_structure is None:
      initial = self.initial_state()
      state = initial if state is None else state
    x = tf.convert_to_tensor(x)
    if x.dtype != self.input_tensorspec.dtype or not self.input_tensorspec.is_compatible_with(x):
      raise ValueError(f"this encoder takes {self.input_tensorspec}, got {x.dtype.name}"
                       f"{x.shape}")
    nested = tf.nest.pack_sequence_as(self._state_structure, list(state))
    encode_params, decode_params = self._encoder.get_params(nested)
    encoded, updates, shapes = self._encoder.encode(x, encode_params)
    new_state = tuple(tf.nest.flatten(self._encoder.update_state(nested, updates)))
    sent = collections.OrderedDict([(_SENT_TENSORS, encoded), (_SENT_PARAMS, decode_params),
                                    (_SENT_SHAPES, shapes)])
    flat = collections.OrderedDict(te.utils.py_utils.flatten_with_joined_string_paths(sent))
    python_values, tensors = te.utils.split_dict_py_tf(flat)
    self._sent_structure = tf.nest.map_structure(lambda _: None, sent)
    self._python_values = python_values
    return tensors, new_state

  def decode(self, encoded: dict) -> tf.Tensor:
    if self._sent_structure is None:
      raise ValueError("nothing was encoded yet: decode needs the structure encode sends")
    merged = te.utils.merge_dicts(dict(encoded), self._python_values)
    flat = [merged[key] for key, _ in te.utils.py_utils.flatten_with_joined_string_paths(
        self._sent_structure)]
    sent = tf.nest.pack_sequence_as(self._sent_structure, flat)
    return self._encoder.decode(sent[_SENT_TENSORS], sent[_SENT_PARAMS], sent[_SENT_SHAPES])


# The top-level keys of what `SimpleEncoder.encode` sends (tensor_encoding's own).
_SENT_TENSORS, _SENT_PARAMS, _SENT_SHAPES = "encoded_tensors", "params", "shapes"


def simple_encoder(encoder: Encoder, spec: tf.TensorSpec) -> SimpleEncoder:
  """`encoder` bound to one tensor spec for one-to-many use (server -> clients)."""
  return SimpleEncoder(encoder, spec)


def gather_encoder(encoder: Encoder, spec: tf.TensorSpec) -> te.core.GatherEncoder:
  """`encoder` bound to one tensor spec for many-to-one use (clients -> server)."""
  return te.encoders.as_gather_encoder(encoder, spec)


def packing_bits(stage: Any) -> int | None:
  """The input bits of a bit-packing stage under fedsim's and tensor_encoding's
  wrappers, or None if `stage` does not pack bits."""
  while True:
    if isinstance(stage, te.stages.BitpackingEncodingStage):
      return stage._input_bits   # pylint: disable=protected-access
    inner = stage.__dict__.get("_wrapped_stage") or stage.__dict__.get("_stage")
    if inner is None:
      return None
    stage = inner


_PACKED_TO = 28   # bits of each int32 that bit packing fills


def unpack_symbols(words: tf.Tensor, bits: int, count: int) -> tf.Tensor:
  """int32[count]: the `bits`-bit symbols bit packing wrote into the int32 `words`."""
  return tf.reshape(tf_utils.unpack_from_int(words, bits, _PACKED_TO, [count]), [-1])
