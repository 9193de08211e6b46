"""The encoder contract, checked on seeded test vectors (eager TensorFlow).

An encoder keeps its contract when, for every value x a client may send,
decode(encode(x)) is near x as its own error allows, and the server's decoded
sum of several clients' encodings is the sum of their decodes, pointing along
their true sum. `check_encoder` measures, per test vector (Gaussian,
heavy-tailed Student t with 3 degrees of freedom, sparse with 5% nonzero;
odd sizes, 2-D and 1-D):

- vNMSE: mean over encodings of ||x^ - x||^2 / ||x||^2;
- bias z: the mean error along x, <mean(x^) - x, x> / ||x||^2, over its
  standard error from the draws (|z| within ~3 for an unbiased encoder;
  +-inf for a deterministic biased one, 0 for an exact one);
- bits per coordinate: the elements of the encoded tensors one client sends,
  times their dtype bits, over the coordinates (32 uncompressed float32);
- sum gap: ||decode(sum of encodings) - sum of decodes|| / ||sum of decodes||
  over `clients` clients (float rounding only, for an encoder that keeps
  the contract);
- sum z: the cosine of the decoded sum, averaged over the draws, with the
  clients' true sum s, times sqrt(n_eff) (n_eff = ||s||^4 / sum s_i^4, the
  coordinates the sum spreads over). A decode unrelated to the sum (e.g. one
  that does not undo the encoder's sign flips) has z ~ N(0, 1);
- sum NMSE: E||decoded sum - s||^2 / ||s||^2: at most 1 for a decode that
  keeps part of s (a projection such as top-k or a low-rank factorization,
  or 1-bit signs of a sparse sum, whose cosine with s can be small), about 2
  for a decode unrelated to s but of its size (sign flips left in, a
  rotation undone with the wrong seed).

The sum decodes when the sum gap is float rounding and either the sum z is
at least 5 or the sum NMSE below 1.5, halfway between those two.

An encoder's draws must also repeat (`unseeded_draws`): the parameters drawn
twice in one round equal (a MapReduceForm draws them once in `prepare`, sent
to the clients, and again in `update`, where the server decodes), and one
value encoded twice the same. fedsim seeds tensor_encoding's
`tf.random.uniform`, `normal` and `truncated_normal` in every stage
(`tensor_encoding_api.seeded`); another random op (`tf.random.shuffle`, a
`tf.random.Generator`) drawing unseeded breaks this.

Draws differ by round (`noise_round`), as a run's do. Each encoding runs as
fedsim's encoded sum runs it: parameters from the encoder's initial state
(inside the round), per-client decode before the sum, the rest after.
The same check, smaller (`first_use`), runs once per process for each plugin
encoder a run builds, and stops the run if the sum does not decode or the
draws do not repeat.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from fedsim.compression import ENCODERS, DirectionSpec, parse_direction
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.errors import UserError

# A decoded sum farther from its sum's direction than this many standard
# deviations of a decode unrelated to it fails the contract (P < 3e-7 by chance).
MIN_SUM_Z = 5.0
# Decoding the sum may differ from summing the decodes by float rounding only.
MAX_SUM_GAP = 1e-3
# A decoded sum this far from the sum (relative squared error) with a low sum z
# is unrelated to it (see the module docstring).
MAX_SUM_NMSE = 1.5


# (name, params) of the encoders checked in this process.
_CHECKED: set = set()


@dataclasses.dataclass(frozen=True)
class Vector:
  """A test vector kind: `shape` and how its values are drawn."""

  name: str
  shape: tuple[int, ...]

  def draw(self, rng: np.random.Generator) -> np.ndarray:
    size = math.prod(self.shape)
    if self.name == "gaussian":
      values = rng.normal(size=size)
    elif self.name == "heavy_tailed":
      values = rng.standard_t(3, size=size)
    else:  # sparse: 5% nonzero Gaussian values
      values = rng.normal(size=size) * (rng.random(size) < 0.05)
    return values.reshape(self.shape).astype(np.float32)


VECTORS = (Vector("gaussian", (77, 13)), Vector("heavy_tailed", (4099,)),
           Vector("sparse", (101, 99)))


@dataclasses.dataclass(frozen=True)
class VectorReport:
  """One test vector's measurements (see the module docstring)."""

  vector: str
  size: int
  vnmse: float
  bias_z: float
  bits_per_coordinate: float
  sum_gap: float
  sum_z: float
  sum_nmse: float

  @property
  def sum_decodes(self) -> bool:
    """The decoded sum is the sum of the decodes and carries the true sum."""
    return self.sum_gap <= MAX_SUM_GAP and (self.sum_z >= MIN_SUM_Z
                                            or self.sum_nmse < MAX_SUM_NMSE)

  def line(self) -> str:
    verdict = "yes" if self.sum_decodes else "NO"
    return (f"{self.vector:<13}{self.size:>7}  {self.vnmse:>10.4g}  {self.bias_z:>7.2f}"
            f"  {self.bits_per_coordinate:>9.3f} ({32 / self.bits_per_coordinate:>5.1f}x)"
            f"  {self.sum_gap:>9.2g}  {self.sum_z:>7.1f}  {self.sum_nmse:>9.4g}  {verdict}")


HEADER = (f"{'vector':<13}{'size':>7}  {'vNMSE':>10}  {'bias z':>7}  {'bits/coord':>9}"
          f" {'vs f32':>7}  {'sum gap':>9}  {'sum z':>7}  {'sum NMSE':>9}  sum decodes")


def direction_of(name: str, params: Mapping[str, Any], key: str = "encoder") -> DirectionSpec:
  """The direction encoding every float tensor with encoder `name` at `params`.

  Raises:
    UserError: unknown encoder (naming `key`) or parameter (`key`.PARAM), a
      parameter the check sets itself (the encoder's name; every tensor
      encoded), or a run's option it would not apply (which tensors, error
      feedback, lossless coding, a controller).
  """
  ENCODERS.get(name, key)
  fixed = {"encoder": (name, "the NAME argument"), "min_elements": (1, "every vector is encoded")}
  for param in sorted(fixed.keys() & params.keys()):
    value, why = fixed[param]
    raise UserError(f"{key}.{param}: the check sets it ({value!r}: {why}); give only the"
                    " encoder's own parameters")
  for param in sorted(_OF_A_RUN & params.keys()):
    raise UserError(f"{key}.{param}: a run's option, not the encoder's: the check encodes"
                    " each vector afresh; give only the encoder's own parameters")
  direction = parse_direction({**params, **{k: v for k, (v, _) in fixed.items()}}, key)
  if direction.control is not None:
    param = direction.control.param
    raise UserError(f"{key}.{param}.controller: a run's controller sets {param} each round;"
                    f" give the value to check, e.g. {param}={direction.control.initial:g}")
  return direction


# A direction's keys beside its encoder's own: which tensors it encodes (every
# one, here), residuals kept across rounds, and lossless coding of what is sent.
_OF_A_RUN = frozenset({"threshold", "error_feedback", "lossless"})


def _encoder(direction: DirectionSpec, spec: tf.TensorSpec, seed: int):
  from fedsim.compression.encoders import encoder_for
  with te_api.noise_key(seed, 0):
    return te_api.gather_encoder(encoder_for(spec, direction), spec)


def _bits(encoded: Mapping[str, tf.Tensor]) -> int:
  return sum(int(np.size(t)) * (8 if t.dtype == tf.bool else t.dtype.size * 8)
             for t in tf.nest.flatten(encoded))


def _round_function(encoder, clients: int):
  """A function of (values [clients, ...], round) -> (decoded sum, per-client
  decodes stacked, client 0's encoded tensors); traced, as in a run, so that
  shapes that depend on the values stay dynamic."""

  # One client's share, traced once and called per client, as a run's client
  # graph is: its draws are seeded by its value (`te_api`), not by its place.
  @tf.function(autograph=False)
  def client(value, encode_params, before_sum, after_sum):
    encoded = encoder.encode(value, encode_params)[0]
    part = encoder.decode_before_sum(encoded, before_sum)
    return encoded, part, encoder.decode_after_sum(part, after_sum, 1)

  @tf.function(autograph=False)
  def one_round(values, round_num):
    state = encoder.initial_state()
    with te_api.noise_round(round_num):
      encode_params, before_sum, after_sum = encoder.get_params(state)
      shares = [client(values[i], encode_params, before_sum, after_sum)
                for i in range(clients)]
    parts = [part for _, part, _ in shares]
    singles = tf.stack([single for _, _, single in shares])
    summed = tf.nest.map_structure(lambda *xs: tf.add_n(list(xs)), *parts)
    return encoder.decode_after_sum(summed, after_sum, clients), singles, shares[0][0]

  return one_round


def client_values(vector: Vector, clients: int, seed: int = 0) -> list[np.ndarray]:
  """The `clients` clients' values of `vector` (float32), drawn from (`seed`, the vector's
  name): client 0's is the same whatever `clients` is."""
  rng = np.random.default_rng([seed, *vector.name.encode()])
  return [vector.draw(rng) for _ in range(clients)]


def measure(direction: DirectionSpec, vector: Vector, clients: int = 4, draws: int = 32,
            seed: int = 0) -> VectorReport:
  """`vector`'s measurements for `direction`'s encoder: `clients` clients' values
  (client 0's is the reported vector), encoded in `draws` rounds."""
  values = client_values(vector, clients, seed)
  with tf.init_scope():  # eager, also while a computation is being traced
    encoder = _encoder(direction, tf.TensorSpec(vector.shape, tf.float32), seed)
    one_round = _round_function(encoder, clients)
    rounds = []
    for r in range(draws):
      decoded_sum, singles, encoded = one_round(tf.constant(np.stack(values)), tf.constant(r))
      rounds.append((decoded_sum.numpy(), list(singles.numpy()), _bits(encoded)))
  x = values[0].astype(np.float64).ravel()
  norm2 = float(x @ x)
  errors = np.stack([singles[0].astype(np.float64).ravel() - x for _, singles, _ in rounds])
  vnmse = float(np.mean(np.sum(errors**2, axis=1)) / norm2)
  along = errors @ x / norm2
  spread = float(np.std(along, ddof=1)) if draws > 1 else 0.0
  if spread > 1e-12 * max(1.0, abs(float(along.mean()))):
    bias_z = float(along.mean() / (spread / math.sqrt(draws)))
  else:
    bias_z = 0.0 if abs(float(along.mean())) < 1e-7 else math.copysign(math.inf, along.mean())
  total = np.sum(values, axis=0).astype(np.float64).ravel()
  gaps = []
  for decoded_sum, singles, _ in rounds:
    of_decodes = np.sum(singles, axis=0).astype(np.float64).ravel()
    gaps.append(np.linalg.norm(decoded_sum.ravel() - of_decodes)
                / max(np.linalg.norm(of_decodes), 1e-30))
  mean_sum = np.mean([d.astype(np.float64).ravel() for d, _, _ in rounds], axis=0)
  cosine = float(mean_sum @ total / max(np.linalg.norm(mean_sum) * np.linalg.norm(total), 1e-30))
  n_eff = float((total @ total)**2 / np.sum(total**4))
  sum_nmse = float(np.mean([np.sum((d.astype(np.float64).ravel() - total)**2)
                             for d, _, _ in rounds]) / (total @ total))
  return VectorReport(vector.name, x.size, vnmse, bias_z, rounds[0][2] / x.size,
                      float(max(gaps)), cosine * math.sqrt(n_eff), sum_nmse)


def _differ(first, second) -> bool:
  return any(np.shape(a) != np.shape(b) or not np.array_equal(a, b, equal_nan=True)
             for a, b in zip(tf.nest.flatten(first), tf.nest.flatten(second), strict=True))


def unseeded_draws(direction: DirectionSpec, spec: tf.TensorSpec, seed: int = 0) -> str | None:
  """Why the draws of `direction`'s encoder on a tensor of `spec` do not repeat,
  or None if they do: its round parameters drawn twice in one round, then one
  Gaussian value encoded twice with the same parameters (see the module docstring)."""
  x = tf.constant(client_values(Vector("gaussian", tuple(spec.shape.as_list())), 1, seed)[0])
  with tf.init_scope():
    encoder = _encoder(direction, spec, seed)
    state = encoder.initial_state()

    @tf.function(autograph=False)
    def draw_params(state):
      with te_api.noise_round(tf.constant(1)):
        return encoder.get_params(state)

    @tf.function(autograph=False)
    def encode(values, encode_params):
      with te_api.noise_round(tf.constant(1)):
        return encoder.encode(values, encode_params)[0]

    params = draw_params(state)
    if _differ(params, draw_params(state)):
      return ("its parameters differ between two draws in one round (an unseeded random op"
              " in get_params: the server would decode with parameters its clients did not"
              " encode with)")
    if _differ(encode(x, params[0]), encode(x, params[0])):
      return ("one value encodes differently twice (an unseeded random op in encode: runs"
              " do not repeat, `local` and `inprocess` differ)")
  return None


@dataclasses.dataclass(frozen=True)
class EncoderReport:
  """`check_encoder`'s result: each test vector's measurements, and why the
  encoder's draws do not repeat (None: they do)."""

  vectors: list[VectorReport]
  unseeded: str | None

  @property
  def passed(self) -> bool:
    return self.unseeded is None and all(r.sum_decodes for r in self.vectors)


def check_encoder(name: str, params: Mapping[str, Any] | None = None, clients: int = 4,
                  draws: int = 32, seed: int = 0) -> EncoderReport:
  """Every test vector's measurements for encoder `name` at `params` (config
  values), and whether its draws repeat (on the first vector's shape).

  Raises:
    UserError: unknown encoder or parameter (one line naming it).
  """
  direction = direction_of(name, params or {})
  _CHECKED.add((name, direction.encoder.params))   # this check supersedes `first_use`'s
  return EncoderReport([measure(direction, v, clients, draws, seed) for v in VECTORS],
                       unseeded_draws(direction, tf.TensorSpec(VECTORS[0].shape, tf.float32),
                                      seed))


_SEEDING_HINT = ("draw with tf.random.stateless_* seeded by noise_seed(x, salt) in encode or"
                 " params_seed(salt) in get_params (fedsim.compression.tensor_encoding_api;"
                 " docs/guides/own-encoder.md)")


def format_report(name: str, report: EncoderReport) -> str:
  """The table `fedsim check encoder` prints, and two last lines with the verdicts."""
  reports = report.vectors
  lines = [HEADER, *(r.line() for r in reports)]
  broken = [r.vector for r in reports if not r.sum_decodes]
  lines.append(f"{name}: the sum decodes as the sum of the decodes on every vector"
               if not broken else
               f"{name}: the sum does not decode on {', '.join(broken)} (see sum gap, sum z)")
  lines.append(f"{name}: its random draws repeat (seeded)" if report.unseeded is None else
               f"{name}: {report.unseeded}; {_SEEDING_HINT}")
  return "\n".join(lines)


def is_plugin(name: str) -> bool:
  """True if encoder `name` was registered outside fedsim (a plugin's)."""
  return not ENCODERS.get(name).build.__module__.startswith("fedsim.")


def first_use(direction: DirectionSpec, spec: tf.TensorSpec) -> None:
  """Checks a plugin encoder the first time this process builds it, for a
  tensor of `spec` (Gaussian values of its shape, 4 clients, 2 rounds);
  built-ins and encoders already checked return at once.

  Raises:
    UserError: one line naming the encoder when its draws do not repeat or
      its sum does not decode.
  """
  name = direction.encoder.name
  key = (name, direction.encoder.params)
  if key in _CHECKED or not is_plugin(name):
    return
  _CHECKED.add(key)
  direction = dataclasses.replace(direction, min_elements=1, threshold=None)
  unseeded = unseeded_draws(direction, spec)
  if unseeded is not None:
    raise UserError(f"encoder '{name}': {unseeded}; {_SEEDING_HINT}")
  report = measure(direction,
                   Vector("gaussian", tuple(spec.shape.as_list())), clients=4, draws=2)
  if report.sum_decodes:
    return
  why = (f"decoding the sum differs from summing the decodes by {report.sum_gap:.2g}"
         if report.sum_gap > MAX_SUM_GAP else
         f"the decoded sum is unrelated to the true sum (z {report.sum_z:.1f} < {MIN_SUM_Z:g},"
         f" NMSE {report.sum_nmse:.2f} >= {MAX_SUM_NMSE:g})")
  raise UserError(f"encoder '{name}': the sum of 4 clients' encodings does not decode ({why});"
                  f" see `fedsim check encoder {name}`")
