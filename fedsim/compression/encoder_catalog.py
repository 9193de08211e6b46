"""Every encoder fedsim ships, registered as `encoder: NAME` exactly as a plugin's would be.

The rule: an encoder is one registration here (its parameters dataclass and a
builder that imports TensorFlow only when called) and, unless it chains
tensor_encoding's own stages, one stage file in `fedsim.compression.stages`
holding the math. Each builder returns a chain of stages ending in bit packing
where the symbols are small integers (28 bits to an int32, see
`encoders.quantization_encoder`), or a single stage. Wire cost per encoded
tensor of n elements (n' = n padded to a power of two where a rotation pads):

  identity  n floats
  uniform   ceil(n * bits / 28) int32 + 2 floats (min, max)
  hadamard  as uniform over n' rotated coordinates, + 2 int32 rotation seed
  qsgd      ceil(n * b / 28) int32, b = ceil(log2(2 * levels + 1)), + 1 float scale
            (bucketed: n padded to a multiple of the bucket, one scale per bucket)
  terngrad  ceil(n * 2 / 28) int32 + 1 float scale
  sign      ceil(n / 28) int32 + 1 float scale
  drive     ceil(n' / 28) int32 + 1 float scale + 2 int32 rotation seed
  eden      ceil(n' * b / 28) int32 + 1 float scale + 2 int32 rotation seed
  topk      k float values + k int32 indices
  randk     k float values + 2 int32 seed of the coordinates drawn
  kashin    ceil(m * bits / 28) int32 + 2 floats (min, max) + 2 int32 seed, m
            Kashin coefficients: n' (2 * n' when n > 0.85 * n')
  powersgd  (rows + cols) * r floats for a tensor viewed as a rows x cols matrix,
            n floats for one of fewer than 2 dimensions (stages/low_rank.py)
  threshold m float values + m int32 indices, m = #{i : |x_i| >= tau}: varies with
            the values, so the server measures it each round (`reports_own_bits`,
            `fedsim.compression.wire_meter`)
  float16, bfloat16   16 bits per element (stages/cast.py)
  nf4       ceil(4 n / 28) int32 + ceil(n / block_size) float32 absmax values
            (QLoRA's double quantization of the absmax values is not implemented)

TensorFlow is imported inside the builders, when a process is built.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from fedsim.compression import ENCODERS
from fedsim.config.typed import bounded
from fedsim.registry import NoParams


@dataclasses.dataclass(frozen=True)
class QuantizationParams:
  """Uniform quantization to `bits` bits per element, then bit packing.

  `stochastic` rounding (up with probability equal to the remainder) is
  unbiased, which is what a mean over clients wants; its error per element is
  below one step (max - min) / (2**bits - 1). `deterministic` rounds to the
  nearest level: at most half a step, but biased.
  """

  bits: int = bounded(8, min=1, max=16)
  rounding: Literal["stochastic", "deterministic"] = "stochastic"


@ENCODERS.register("identity")
def _identity(params: NoParams) -> Any:
  """Sends tensors unchanged (32 bits per float32 element)."""
  del params
  from fedsim.compression import tensor_encoding_api as te_api
  return te_api.identity_encoder()


@ENCODERS.register("uniform", params=QuantizationParams)
def _uniform(params: QuantizationParams) -> Any:
  """Uniform quantization between the tensor's min and max, bit-packed."""
  from fedsim.compression.encoders import quantization_encoder
  return quantization_encoder(params.bits, params.rounding == "stochastic", rotate=False)


@ENCODERS.register("hadamard", params=QuantizationParams)
def _hadamard(params: QuantizationParams) -> Any:
  """Randomized Hadamard rotation (pads to a power of two), then uniform quantization."""
  from fedsim.compression.encoders import quantization_encoder
  return quantization_encoder(params.bits, params.rounding == "stochastic", rotate=True)


@dataclasses.dataclass(frozen=True)
class QSGDParams:
  """`levels` (QSGD's s) steps between 0 and ||x||_2 for each coordinate's magnitude;
  `bucket` > 0: one norm per run of that many coordinates (0: one per tensor)."""

  levels: int = bounded(7, min=1, max=32767)
  bucket: int = bounded(0, min=0)


def packed_bits(levels: int) -> int:
  """Bits of one symbol in [0, 2 * levels]: ceil(log2(2 * levels + 1))."""
  return math.ceil(math.log2(2 * levels + 1))


@ENCODERS.register("qsgd", params=QSGDParams)
def _qsgd(params: QSGDParams) -> Any:
  """QSGD (Alistarh et al. 2017): stochastic rounding of |x_i| to s levels of ||x||_2, unbiased."""
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.stages.stochastic_levels import L2, StochasticLevelsStage
  return te_api.chain(te_api.stages.FlattenEncodingStage(),
                      StochasticLevelsStage(params.levels, L2, params.bucket),
                      te_api.stages.BitpackingEncodingStage(packed_bits(params.levels)))


@ENCODERS.register("terngrad")
def _terngrad(params: NoParams) -> Any:
  """TernGrad (Wen et al. 2017): max|x| * sign(x_i) * Bernoulli(|x_i| / max|x|), 2 bits each."""
  del params
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.stages.stochastic_levels import MAX, StochasticLevelsStage
  return te_api.chain(te_api.stages.FlattenEncodingStage(),
                      StochasticLevelsStage(1, MAX),
                      te_api.stages.BitpackingEncodingStage(packed_bits(1)))


@ENCODERS.register("sign")
def _sign(params: NoParams) -> Any:
  """Scaled signSGD: 1 bit per coordinate and one scale ||x||_1 / n (biased)."""
  del params
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.stages.sign import MEAN_ABS, SignStage
  return te_api.chain(te_api.stages.FlattenEncodingStage(), SignStage(MEAN_ABS),
                      te_api.stages.BitpackingEncodingStage(1))


@dataclasses.dataclass(frozen=True)
class DriveParams:
  """DRIVE's scale: `unbiased` ||x||^2 / ||Rx||_1 or `mse` ||Rx||_1 / n (least error)."""

  scale: Literal["unbiased", "mse"] = "unbiased"


@ENCODERS.register("drive", params=DriveParams)
def _drive(params: DriveParams) -> Any:
  """DRIVE (Vargaftik et al. 2021): randomized Hadamard rotation, 1 bit per coordinate, one scale."""
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.stages.sign import MEAN_ABS, UNBIASED, SignStage
  return te_api.chain(te_api.stages.FlattenEncodingStage(), te_api.SeededHadamardStage(),
                      SignStage(UNBIASED if params.scale == "unbiased" else MEAN_ABS),
                      te_api.stages.BitpackingEncodingStage(1))


@dataclasses.dataclass(frozen=True)
class EdenParams:
  """`bits` per rotated coordinate: the index of its Lloyd-Max centroid of N(0, 1)."""

  bits: int = bounded(1, min=1, max=8)


@ENCODERS.register("eden", params=EdenParams)
def _eden(params: EdenParams) -> Any:
  """EDEN (Vargaftik et al. 2022): Hadamard rotation, b-bit Lloyd-Max levels, unbiased scale."""
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.stages.eden import EdenStage
  return te_api.chain(te_api.stages.FlattenEncodingStage(), te_api.SeededHadamardStage(),
                      EdenStage(params.bits), te_api.stages.BitpackingEncodingStage(params.bits))


@dataclasses.dataclass(frozen=True)
class SparsifyParams:
  """Coordinates kept per tensor: `k` if positive, else ceil(`fraction` * n)."""

  fraction: float = bounded(0.01, gt=0.0, max=1.0)
  k: int = bounded(0, min=0)


@ENCODERS.register("topk", params=SparsifyParams)
def _topk(params: SparsifyParams) -> Any:
  """Top-k: the k largest |x_i|, sent as k float values and k int32 indices."""
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.stages.sparsify import TopKStage
  return te_api.chain(te_api.stages.FlattenEncodingStage(),
                      TopKStage(params.fraction, params.k))


@dataclasses.dataclass(frozen=True)
class RandKParams(SparsifyParams):
  """As top-k; `unbiased` scales the kept values by n / k so that E[decoded] = x."""

  unbiased: bool = True


@ENCODERS.register("randk", params=RandKParams)
def _randk(params: RandKParams) -> Any:
  """Random-k: k uniformly drawn coordinates, sent as k float values and the 64-bit seed."""
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.stages.sparsify import RandKStage
  return te_api.chain(te_api.stages.FlattenEncodingStage(),
                      RandKStage(params.fraction, params.k, params.unbiased))


@dataclasses.dataclass(frozen=True)
class KashinParams:
  """Kashin's representation, then `bits`-bit quantization of its coefficients.

  `delta` sets the first clipping level ||x|| / sqrt(delta * m), `eta` (< 1)
  its decay per iteration (tensor_encoding's parameters).
  """

  bits: int = bounded(2, min=1, max=16)
  eta: float = bounded(0.9, gt=0.0, max=0.99)
  delta: float = bounded(1.0, gt=0.0)
  iterations: int = bounded(3, min=1)


@ENCODERS.register("kashin", params=KashinParams)
def _kashin(params: KashinParams) -> Any:
  """Kashin representation (Lyubarskii & Vershynin 2010) then stochastic uniform quantization."""
  from fedsim.compression import tensor_encoding_api as te_api
  return te_api.chain(
      te_api.stages.FlattenEncodingStage(),
      te_api.SeededKashinStage(params.eta, params.delta, params.iterations),
      te_api.SeededUniformQuantizationStage(params.bits, stochastic=True),
      te_api.stages.BitpackingEncodingStage(params.bits))


@dataclasses.dataclass(frozen=True)
class PowerSgdParams:
  """`rank` columns per factor (capped at min(n, m), where the update is sent
  exactly); `warm_start`: start each round from the last round's Q."""

  rank: int = bounded(1, min=1)
  warm_start: bool = True


@ENCODERS.register("powersgd", params=PowerSgdParams)
def _powersgd(params: PowerSgdParams) -> Any:
  """PowerSGD (Vogels et al. 2019), per client: rank-r factors P^, Q', warm-started Q."""
  from fedsim.compression.encoders import encoded_spec
  from fedsim.compression.stages.low_rank import PowerSgdStage
  return PowerSgdStage(params.rank, params.warm_start, encoded_spec().shape.as_list())


@dataclasses.dataclass(frozen=True)
class ThresholdParams:
  """Coordinates with |x_i| >= `tau` (an absolute magnitude) are sent."""

  tau: float = bounded(gt=0.0)


@ENCODERS.register("threshold", params=ThresholdParams, traits={"reports_own_bits": True})
def _threshold(params: ThresholdParams) -> Any:
  """Threshold sparsification: values with |x_i| >= tau and their int32 indices; bits vary."""
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.stages.threshold import ThresholdStage
  return te_api.chain(te_api.stages.FlattenEncodingStage(), ThresholdStage(params.tau))


@ENCODERS.register("float16")
def _float16(params: NoParams) -> Any:
  """IEEE half precision (10 mantissa bits; overflows to inf above 65,504), 16 bits each."""
  del params
  import tensorflow as tf
  from fedsim.compression.stages.cast import CastStage
  return CastStage(tf.float16)


@ENCODERS.register("bfloat16")
def _bfloat16(params: NoParams) -> Any:
  """bfloat16 (float32's range, 7 mantissa bits), 16 bits each."""
  del params
  import tensorflow as tf
  from fedsim.compression.stages.cast import CastStage
  return CastStage(tf.bfloat16)


@dataclasses.dataclass(frozen=True)
class NF4Params:
  """One float32 absmax per `block_size` elements (QLoRA uses 64)."""

  block_size: int = bounded(64, min=1)


@ENCODERS.register("nf4", params=NF4Params)
def _nf4(params: NF4Params) -> Any:
  """NF4 (QLoRA): absmax per block, nearest of 16 N(0, 1) quantiles, 4 bits each, packed."""
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.compression.stages.normal_float import BITS, NormalFloatStage
  return te_api.chain(te_api.stages.FlattenEncodingStage(),
                      NormalFloatStage(params.block_size),
                      te_api.stages.BitpackingEncodingStage(BITS))
