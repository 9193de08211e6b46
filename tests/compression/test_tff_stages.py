"""Encoders built from tensor_encoding's own stages give TFF's results, on every runtime.

A user chains `te.stages` (as TFF's tutorials do) in a plugin encoder; fedsim
seeds their random draws (`tensor_encoding_api._ChainedStage`) from the run
seed, the tensor, the round and the stage's position. The oracle is TFF
0.87's own `EncodedSumFactory` under `UnweightedMeanFactory`, fed the same
client values for 3 rounds: a stage kind whose only randomness is a
server-drawn parameter (a rotation's seed) gets fedsim's draw for that round
(read from fedsim's stage, so TFF's rotation is the same matrix), and must
then agree to 1e-6; a kind that rounds or seeds at random on the clients is
compared by its error distribution (two-sample KS and the bias's z-score).

fedsim's mean runs on `local` (TFF's worker), on `inprocess` (the round's
MapReduceForm phases in this process's TensorFlow, where an unseeded rotation
seed is drawn once in `prepare` and again in `update`) and on `ray` (those
phases with the clients' `work` on two Ray actors of a two-node cluster,
merged on the driver). `local` and `inprocess` must agree exactly for every
kind, `ray` to float rounding (its chunks merge in another order). One
cluster serves every kind: its actors start once and build each kind's round
as a variant on first use (tests/compression/te_kinds_plugin.py registers
the kinds there). test_tff_chain_runs.py trains issue 33's chain from a
config on every runtime.

Every `te.stages` export that encodes a float tensor is a kind here;
`BitpackingEncodingStage` and `DifferenceBetweenIntegersEncodingStage` take
integers (fedsim encodes float tensors only), so bit packing appears where
TFF's tutorials put it, after quantizing. `SplitBySmallValueEncodingStage`
sends as many values as exceed its threshold, so its encoder is registered
with `reports_own_bits=True`, as such an encoder must be. The cases run on
TFF's worker and compile a round each on every runtime: three kinds, one of
each randomness (none, stochastic rounding, a seeded generator), run by
default, the rest with `-m long`.
"""

from __future__ import annotations

import dataclasses
import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.compression import ENCODERS, parse_direction, register_encoder
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.mean import build_encoded_mean
from fedsim.runtime.inprocess import InProcessProcess

stages = te_api.stages
research = stages.research
SHAPE = (40, 25)      # 1,000 values: Hadamard pads to 1,024, per-channel quantizes 25 columns
CLIENTS, ROUNDS, RUN_SEED = 3, 3, 5


@dataclasses.dataclass(frozen=True)
class Kind:
  """A chain of `te.stages`; `random`: it rounds or seeds at random on the clients."""

  build: object
  random: bool = False


KINDS = {
    "identity": Kind(lambda: [stages.IdentityEncodingStage()]),
    "flatten": Kind(lambda: [stages.FlattenEncodingStage()]),
    "uniform_nearest": Kind(lambda: [stages.FlattenEncodingStage(),
                                     stages.UniformQuantizationEncodingStage(8, stochastic=False),
                                     stages.BitpackingEncodingStage(8)]),
    "uniform_stochastic": Kind(lambda: [stages.FlattenEncodingStage(),
                                        stages.UniformQuantizationEncodingStage(4),
                                        stages.BitpackingEncodingStage(4)], random=True),
    # Issue 33's chain: trained to chance on `inprocess` before the seeds were fedsim's.
    "hadamard_nearest": Kind(lambda: [stages.FlattenEncodingStage(),
                                      stages.HadamardEncodingStage(),
                                      stages.UniformQuantizationEncodingStage(4, stochastic=False),
                                      stages.BitpackingEncodingStage(4)]),
    "hadamard_stochastic": Kind(lambda: [stages.FlattenEncodingStage(),
                                         stages.HadamardEncodingStage(),
                                         stages.UniformQuantizationEncodingStage(4),
                                         stages.BitpackingEncodingStage(4)], random=True),
    "kashin_nearest": Kind(lambda: [stages.FlattenEncodingStage(),
                                    research.KashinHadamardEncodingStage(),
                                    stages.UniformQuantizationEncodingStage(4, stochastic=False),
                                    stages.BitpackingEncodingStage(4)]),
    "clip_by_norm": Kind(lambda: [research.ClipByNormEncodingStage(20.0)]),
    "clip_by_value": Kind(lambda: [research.ClipByValueEncodingStage(-1.0, 1.5)]),
    "per_channel_nearest": Kind(lambda: [
        research.PerChannelUniformQuantizationEncodingStage(4, stochastic=False)]),
    "per_channel_stochastic": Kind(lambda: [
        research.PerChannelUniformQuantizationEncodingStage(4)], random=True),
    "prng_uniform": Kind(lambda: [stages.FlattenEncodingStage(),
                                  research.PRNGUniformQuantizationEncodingStage(4)], random=True),
    "per_channel_prng": Kind(lambda: [
        research.PerChannelPRNGUniformQuantizationEncodingStage(4)], random=True),
    "split_by_small_value": Kind(lambda: [stages.FlattenEncodingStage(),
                                          research.SplitBySmallValueEncodingStage(0.5)]),
}


@pytest.fixture(scope="module", autouse=True)
def _runtime(tff_runtime):
  yield tff_runtime


@pytest.fixture
def registered(monkeypatch):
  """register(kind) -> the direction of a plugin encoder chaining `kind`'s stages."""
  monkeypatch.setattr(ENCODERS, "_entries", dict(ENCODERS._entries))

  def register(kind: str):
    register_encoder(f"te_{kind}", reports_own_bits=True)(lambda params: te_api.chain(*KINDS[kind].build()))
    return direction_of(kind)

  return register


def client_values(round_num: int) -> list[np.ndarray]:
  """Round `round_num`'s client values: Gaussian, heavy-tailed and offset."""
  rng = np.random.default_rng(100 + round_num)
  return [rng.normal(size=SHAPE).astype(np.float32),
          rng.standard_t(3, size=SHAPE).astype(np.float32),
          (rng.normal(size=SHAPE) + 2.0).astype(np.float32)]


def _as_iterative(aggregation: tff.templates.AggregationProcess) -> tff.templates.IterativeProcess:
  """(state, values@CLIENTS) -> (state, mean): the shape a runtime compiles."""
  state_type, values_type = aggregation.next.type_signature.parameter

  @tff.federated_computation(state_type, values_type)
  def next_fn(state, values):
    output = aggregation.next(state, values)
    return output.state, output.result

  return tff.templates.IterativeProcess(aggregation.initialize, next_fn)


def direction_of(kind: str):
  """The aggregation direction of encoder `te_KIND` (registered by the caller)."""
  return parse_direction({"encoder": f"te_{kind}", "min_elements": 1}, "c.aggregation")


def encoded_mean(direction) -> tff.templates.IterativeProcess:
  """fedsim's encoded mean of `SHAPE` values in `direction`, as a runtime compiles it."""
  return _as_iterative(build_encoded_mean(direction, weighted=False, seed=RUN_SEED).create(
      tff.TensorType(np.float32, SHAPE)))


def actor_round(device: str, kind: str | None = None):
  """A Ray actor's build of `kind`'s round: (its `InProcessProcess`, no packer);
  (None, None) for the actor's first build, before any kind is asked for."""
  if kind is None:
    return None, None
  import tests.compression.te_kinds_plugin  # noqa: F401  (registers te_KIND in the actor)
  return InProcessProcess(encoded_mean(direction_of(kind)), device), None


@pytest.fixture(scope="module")
def cluster(ray_cluster):
  """A `ClusterProcess` of two actors on the two-node cluster, built once for
  every kind (each kind is a variant: the actors build its round on first use)."""
  from fedsim.runtime.cluster import ClusterProcess, ClusterSpec
  address, _ = ray_cluster
  process = ClusterProcess(None, functools.partial(actor_round, "cpu"),
                           ClusterSpec(address=address, workers=2, device="cpu", timeout_s=900))
  yield process
  process.close()  # the actors wait for the next run (the cluster fixture ends them)


def fedsim_means(direction, runtime: str, cluster=None, kind: str | None = None) -> list[np.ndarray]:
  """fedsim's encoded mean of each round's client values on `runtime` (`ray`:
  on `cluster`'s actors, which build `kind`'s round)."""
  process = encoded_mean(direction)
  if runtime == "inprocess":
    process = InProcessProcess(process, "cpu")
  elif runtime == "ray":
    process = cluster.with_variant(InProcessProcess(process, "cpu"), {"kind": kind})
  state, means = process.initialize(), []
  for round_num in range(ROUNDS):
    state, mean = process.next(state, client_values(round_num))
    means.append(np.asarray(mean))
  return means


def _fedsim_params(kind: str, round_num: int) -> list[dict]:
  """Each stage's encode parameters as fedsim draws them in round `round_num`
  (the tensor is the value's only one: index 0)."""
  chained = []
  with te_api.noise_key(RUN_SEED, 0):
    encoder = te_api.chain(*KINDS[kind].build())
  while True:
    chained.append(encoder.stage)
    if not encoder.children:
      break
    (encoder,) = encoder.children.values()
  with te_api.noise_round(round_num):
    return [{k: np.asarray(v) for k, v in s.get_params(None)[0].items()} for s in chained]


def _pinned(stage, params: dict):
  """`stage` (TFF's own) with fedsim's draw of its seed parameter, if it draws one."""
  if "seed" not in params:
    return stage
  drawn = stage.get_params

  def get_params(name=None):
    del name
    encode_params, decode_params = drawn()
    for found in (encode_params, decode_params):
      if "seed" in found:
        found["seed"] = tf.constant(params["seed"])
    return encode_params, decode_params

  stage.get_params = get_params
  return stage


def tff_means(kind: str) -> list[np.ndarray]:
  """TFF 0.87's encoded mean of the same values: its own EncodedSumFactory and
  stages, with fedsim's draw of a per-round parameter (a rotation's seed)."""
  from tensorflow_model_optimization.python.core.internal import tensor_encoding as te
  value_type = tff.TensorType(np.float32, SHAPE)
  means = []
  for round_num in range(ROUNDS):
    params = _fedsim_params(kind, round_num)

    def encoder_fn(spec, params=params):
      built = [_pinned(s, p) for s, p in zip(KINDS[kind].build(), params)]
      composer = te.core.EncoderComposer(built[-1])
      for parent in reversed(built[:-1]):
        composer = composer.add_parent(parent, parent.compressible_tensors_keys[0])
      return te.encoders.as_gather_encoder(composer.make(), spec)

    process = tff.aggregators.UnweightedMeanFactory(
        tff.aggregators.EncodedSumFactory(encoder_fn)).create(value_type)
    means.append(np.asarray(process.next(process.initialize(), client_values(round_num)).result))
  return means


def _errors(means: list[np.ndarray]) -> np.ndarray:
  """Every coordinate's error against the exact mean, over the rounds."""
  return np.concatenate([(m - np.mean(client_values(r), axis=0)).ravel()
                         for r, m in enumerate(means)])


DEFAULT_KINDS = ("hadamard_nearest", "uniform_stochastic", "prng_uniform")


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("kind", [k if k in DEFAULT_KINDS else pytest.param(k, marks=pytest.mark.long)
                                  for k in sorted(KINDS)])
def test_a_chain_of_te_stages_gives_tffs_mean_on_every_runtime(registered, cluster, kind):
  direction = registered(kind)
  local, inprocess = fedsim_means(direction, "local"), fedsim_means(direction, "inprocess")
  for got, want in zip(inprocess, local, strict=True):   # the equality fedsim documents
    np.testing.assert_array_equal(got, want)
  on_ray = fedsim_means(direction, "ray", cluster, kind)
  for got, want in zip(on_ray, inprocess, strict=True):  # the same draws, chunks merged
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  oracle = tff_means(kind)
  for runtime, means in (("local", local), ("ray", on_ray)):
    if not KINDS[kind].random:
      for got, want in zip(means, oracle, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=runtime)
      continue
    ours, theirs = _errors(means), _errors(oracle)
    assert np.abs(ours).max() > 0, runtime   # it is quantized
    assert scipy.stats.ks_2samp(ours, theirs).pvalue > 1e-4, runtime
    # Unbiased as TFF's: the mean error within 4.5 standard errors of zero.
    assert abs(ours.mean()) < 4.5 * ours.std() / np.sqrt(ours.size), runtime
    assert 0.8 < ours.std() / theirs.std() < 1.25, runtime


def test_rotation_seeds_are_the_runs_per_round_and_shared_by_encode_and_decode():
  """The rotation's seed is a function of (run seed, tensor, round): the same
  when drawn twice (a MapReduceForm's `prepare` and `update`), new each round
  and each run seed."""
  def seed(run_seed, round_num, kind="hadamard_nearest"):
    with te_api.noise_key(run_seed, 0):
      hadamard = te_api.chain(*KINDS[kind].build()).children["flattened_values"].stage
    with te_api.noise_round(round_num):
      encode_params, decode_params = hadamard.get_params(None)
      np.testing.assert_array_equal(encode_params["seed"], decode_params["seed"])
      return tuple(np.asarray(encode_params["seed"]))

  assert seed(5, 0) == seed(5, 0)
  assert len({seed(5, 0), seed(5, 1), seed(5, 2), seed(6, 0)}) == 4
