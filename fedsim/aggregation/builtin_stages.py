"""The aggregation and broadcast stages fedsim ships, each a registered entry.

They are registered exactly as a plugin's stage would be (see
`register_aggregation_stage`); TensorFlow is imported inside the builders.
Every stage composes one of TFF's own `tff.aggregators` factories; only the
Gaussian noise of `dp_gaussian` is fedsim's (seeded, see `private.py`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from fedsim.aggregation import (COMPLETE, MEAN, PRIVATE, SUM, WEIGHTED_MEAN, WRAP,
                                StageContext, register_aggregation_stage,
                                register_broadcast_stage)
from fedsim.config.typed import bounded
from fedsim.errors import UserError
from fedsim.registry import NoParams, resolve


def _parse_encode(data: Any, key: str):
  from fedsim.compression import parse_direction
  return parse_direction(data, key)


@dataclasses.dataclass(frozen=True)
class EncodeParams:
  """Documents `encode`'s keys; the encoder's own parameters follow its name."""

  encoder: str = "identity"   # a registered encoder (see `fedsim list encoder`)
  min_elements: int = 10000   # smaller (or non-float) tensors are sent unchanged
  threshold: int | None = None  # instead: only tensors with MORE elements (TFF's rule)
  # Clients (upload) or the server (broadcast) keep what the encoder dropped and resend it.
  error_feedback: bool = False
  # huffman: the packed symbols are Huffman-coded and counted at the code's size.
  lossless: Literal["none", "huffman"] = "none"


@register_aggregation_stage("encode", EncodeParams, role=SUM, parser=_parse_encode,
                            compresses=True)
def build_encode(params, context: StageContext):
  """Each client encodes its value per tensor; the server decodes and sums (last stage)."""
  from fedsim.compression.mean import build_encoded_sum
  return build_encoded_sum(params, context.seed)


@register_broadcast_stage("encode", EncodeParams, parser=_parse_encode, compresses=True)
def build_encoded_broadcast(params, weights_type, context: StageContext):
  """The server encodes the model once; every client decodes the same encoded value."""
  from fedsim.compression.broadcast import build_encoded_broadcast as build
  return build(weights_type, params, context.seed)


@register_aggregation_stage("sum", NoParams, role=SUM)
def build_sum(params, context: StageContext):
  """TFF's plain float sum (the default last stage)."""
  del params, context
  import tensorflow_federated as tff
  return tff.aggregators.SumFactory()


@dataclasses.dataclass(frozen=True)
class SecureParams:
  # Values are clipped to [lower, upper] and summed as integers by
  # `tff.federated_secure_sum_bitwidth` (TFF's SecureSumFactory).
  upper: float = bounded(min=0)
  lower: float | None = None   # None: -upper

  def check(self, key: str) -> None:
    lower = -self.upper if self.lower is None else self.lower
    if not lower < self.upper:
      raise UserError(f"{key}.lower: must be below upper ({self.upper}), got {lower}")


@register_aggregation_stage("secure", SecureParams, role=SUM)
def build_secure(params: SecureParams, context: StageContext):
  """Secure summation of values clipped to [lower, upper] (runtime `local` only)."""
  del context
  import tensorflow_federated as tff
  lower = -params.upper if params.lower is None else params.lower
  return tff.aggregators.SecureSumFactory(float(params.upper), float(lower))


@register_aggregation_stage("mean", NoParams, role=MEAN, inner_key="mean_value")
def build_mean(params, inner, context: StageContext):
  """Marks where the algorithm's mean goes (weighted by examples or not, as it says)."""
  del params
  import tensorflow_federated as tff
  if context.kind == WEIGHTED_MEAN:
    return tff.aggregators.MeanFactory(inner)
  return tff.aggregators.UnweightedMeanFactory(inner)


@dataclasses.dataclass(frozen=True)
class ZeroingParams:
  max_norm: float = bounded(gt=0)   # updates whose norm exceeds this become zero
  norm: Literal["linf", "l2", "l1"] = "linf"


_NORM_ORDERS = {"linf": math.inf, "l2": 2.0, "l1": 1.0}


@register_aggregation_stage("zeroing", ZeroingParams, role=WRAP, inner_key="zeroing")
def build_zeroing(params: ZeroingParams, inner, context: StageContext):
  """Replaces a client's whole update by zeros when its norm exceeds max_norm."""
  del context
  import tensorflow_federated as tff
  return tff.aggregators.zeroing_factory(params.max_norm, inner,
                                         norm_order=_NORM_ORDERS[params.norm])


@dataclasses.dataclass(frozen=True)
class ClipParams:
  norm: float = bounded(gt=0)          # the L2 clip (the initial one when adaptive)
  adaptive: bool = False               # track a quantile of update norms (Andrew et al. 2021)
  target_quantile: float = bounded(0.5, min=0, max=1)
  learning_rate: float = bounded(0.2, min=0)

  def check(self, key: str) -> None:
    defaults = ClipParams(norm=self.norm)
    if not self.adaptive and (self.target_quantile, self.learning_rate) != (
        defaults.target_quantile, defaults.learning_rate):
      raise UserError(f"{key}.target_quantile/learning_rate: only used with adaptive: true")


def clipping_norm(params: ClipParams) -> Any:
  """A fixed float norm, or TFF's (noise-free) geometric quantile estimator."""
  if not params.adaptive:
    return params.norm
  import tensorflow_federated as tff
  return tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
      initial_estimate=params.norm, target_quantile=params.target_quantile,
      learning_rate=params.learning_rate)


@register_aggregation_stage("clip", ClipParams, role=WRAP, inner_key="clipping")
def build_clip(params: ClipParams, inner, context: StageContext):
  """Scales each client's update down to L2 norm <= the clip (fixed or adaptive)."""
  del context
  import tensorflow_federated as tff
  return tff.aggregators.clipping_factory(clipping_norm(params), inner)


@dataclasses.dataclass(frozen=True)
class DpGaussianParams:
  noise_multiplier: float = bounded(min=0)  # noise stddev on the sum / clip norm
  clip: float | None = bounded(None, gt=0)  # None: taken from a `clip` stage right before
  adaptive: bool = False                    # adaptive clip (privately estimated quantile)
  target_quantile: float = bounded(0.5, min=0, max=1)
  learning_rate: float = bounded(0.2, min=0)
  # Adaptive only: noise on the clipped count; None: 0.05 * clients_per_round (TFF's).
  clipped_count_stddev: float | None = bounded(None, gt=0)
  delta: float = bounded(1e-5, gt=0, max=1)  # the delta epsilon is reported at
  # How epsilon is accounted (aggregation/accounting.py): Renyi DP, or privacy
  # loss distributions (tight up to a 1e-3 grid of the loss).
  accountant: Literal["rdp", "pld"] = "rdp"


def _check_dp_gaussian(params: DpGaussianParams, context: StageContext, key: str) -> None:
  """TFF splits the noise between values and the clipped count; the split
  needs clipped_count_stddev > noise_multiplier / 2."""
  if not params.adaptive or params.noise_multiplier == 0:
    return
  stddev = params.clipped_count_stddev or 0.05 * context.clients_per_round
  if 2 * stddev <= params.noise_multiplier:
    raise UserError(f"{key}.clipped_count_stddev: {stddev:g} is too small for adaptive"
                    f" clipping at noise_multiplier {params.noise_multiplier:g}; it must be"
                    f" above {params.noise_multiplier / 2:g} (the default is 0.05 x"
                    " clients_per_round)")


def _dp_gaussian_ledger(params: DpGaussianParams, scope):
  from fedsim.aggregation.accounting import PrivacyLedger
  return PrivacyLedger(params.noise_multiplier, scope.population, scope.sample_size,
                       params.delta, poisson_rate=scope.poisson_rate,
                       accountant=params.accountant)


@register_aggregation_stage("dp_gaussian", DpGaussianParams, role=PRIVATE, inner_key="dp",
                            own_key="dp_query_metrics", check_context=_check_dp_gaussian,
                            privacy_ledger=_dp_gaussian_ledger)
def build_dp_gaussian(params: DpGaussianParams, inner, context: StageContext):
  """Clip each update, sum, add seeded Gaussian noise, divide by clients_per_round (DP-FedAvg)."""
  from fedsim.aggregation import private
  return private.gaussian_factory(params, inner, context)


def absorb_clip(stages):
  """The chain with a `clip` stage right before a clip-less `dp_gaussian` folded into it.

  `dp_gaussian` clips every update itself (its sensitivity is the clip), so
  `[clip {norm: 1}, dp_gaussian {}]` means one clip at 1.0, not two.

  Raises:
    UserError: a `dp_gaussian` with no clip of either kind.
  """
  from fedsim.config.typed import Component
  out = []
  for i, stage in enumerate(stages):
    if stage.name == "dp_gaussian" and stage.params.clip is None:
      previous = out[-1] if out else None
      if previous is None or previous.name != "clip":
        raise UserError(f"aggregation[{i}] dp_gaussian: needs clip: NORM, or a clip stage"
                        " right before it")
      clip = previous.params
      stage = dataclasses.replace(stage, params=dataclasses.replace(
          stage.params, clip=clip.norm, adaptive=clip.adaptive,
          target_quantile=clip.target_quantile, learning_rate=clip.learning_rate))
      out[-1] = stage
      continue
    out.append(stage)
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class RobustParams:
  zeroing: bool = True    # adaptive zeroing of outlier updates
  clipping: bool = True   # adaptive L2 clipping at the median norm


@register_aggregation_stage("robust", RobustParams, role=COMPLETE)
def build_robust(params: RobustParams, context: StageContext):
  """TFF's `robust_aggregator`: adaptive zeroing and clipping around the mean (last stage)."""
  import tensorflow_federated as tff
  return tff.learning.robust_aggregator(
      zeroing=params.zeroing, clipping=params.clipping,
      weighted=context.kind == WEIGHTED_MEAN)


@dataclasses.dataclass(frozen=True)
class FactoryParams:
  builder: str                        # "package.module:function" returning the factory
  args: dict[str, Any] = dataclasses.field(default_factory=dict)  # keyword arguments
  # wrap: builder(inner_factory, **args) wraps the stages after it;
  # sum: the last stage, an unweighted sum (fedsim puts the mean above it);
  # complete: the last stage, the whole aggregation including the mean.
  role: Literal["wrap", "sum", "complete"] = "complete"
  inner_key: str | None = None        # where its measurements nest the inner ones


def _factory_role(params: FactoryParams) -> str:
  return params.role


@register_aggregation_stage("factory", FactoryParams, role=_factory_role,
                            inner_key=lambda params: params.inner_key)
def build_user_factory(params: FactoryParams, *args):
  """Any `tff.aggregators` factory built by your own function."""
  build = resolve(params.builder, key=f"aggregation[{args[-1].index}]")
  try:
    return build(args[0], **params.args) if params.role == WRAP else build(**params.args)
  except Exception as e:  # pylint: disable=broad-except  (the user's code, the user's error)
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    raise UserError(f"aggregation[{args[-1].index}].builder: {params.builder} raised"
                    f" {type(e).__name__}: {text}") from None
