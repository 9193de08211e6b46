"""DP-FedAvg's Gaussian mechanism (McMahan et al. 2018, "Learning Differentially
Private Recurrent Language Models") as TFF's `DifferentiallyPrivateFactory`,
with noise a run can repeat.

Per round, with clip C and noise multiplier z over the aggregated clients i:
    mean = (sum_i clip(u_i, C) + N(0, (z C)^2 I)) / clients_per_round,
    clip(u, C) = u * min(1, C / ||u||_2).
With `adaptive`, C follows a privately estimated quantile of the clients'
update norms (Andrew et al. 2021), TFF's `gaussian_adaptive` construction.

tensorflow_privacy draws the noise with unseeded TensorFlow ops, so two runs
of one config would differ. Here the queries are TFF's and
tensorflow_privacy's own, except that every Gaussian draw is
`tf.random.stateless_normal` seeded by (run seed, stage index, round count,
draw number); the round count lives in the aggregator state, so a resumed run
draws exactly the noise an uninterrupted one does. The queries' internals it
reaches into are read through fedsim/backend/privacy.py.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Callable

import dp_accounting
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from fedsim.backend import privacy

_seed_scope: list[list[Any]] = []   # [seed tensor, draws so far] while a query adds noise


@contextlib.contextmanager
def _noise_seed(seed: tf.Tensor):
  _seed_scope.append([seed, 0])
  try:
    yield
  finally:
    _seed_scope.pop()


def _next_seed() -> tf.Tensor:
  if not _seed_scope:
    raise RuntimeError("fedsim's seeded Gaussian query used outside SeededQuery")
  scope = _seed_scope[-1]
  scope[1] += 1
  return tf.random.experimental.stateless_fold_in(scope[0], scope[1])


class SeededGaussianSumQuery(tfp.GaussianSumQuery):
  """`GaussianSumQuery` whose noise comes from the enclosing `SeededQuery`'s seed."""

  def get_noised_result(self, sample_state, global_state):
    def add_noise(v):
      noise = tf.random.stateless_normal(tf.shape(v), _next_seed(), stddev=global_state.stddev)
      return v + tf.cast(noise, v.dtype)

    result = tf.nest.map_structure(add_noise, sample_state)
    event = dp_accounting.GaussianDpEvent(global_state.stddev / global_state.l2_norm_clip)
    return result, global_state, event


class SeededQuery(tfp.SumAggregationDPQuery):
  """Wraps a query: its state gains a round counter that seeds the round's noise,
  and the clip and noise stddev used in the round, which it reports as metrics."""

  def __init__(self, query: tfp.SumAggregationDPQuery, seed: int,
               sum_state: Callable[[Any], Any]):
    self._query = query
    self._seed = int(seed)
    self._sum_state = sum_state  # inner global state -> the GaussianSumQuery's state

  def initial_global_state(self):
    inner = self._query.initial_global_state()
    gaussian = self._sum_state(inner)
    return collections.OrderedDict(
        inner=inner, round=tf.constant(0, tf.int64),
        clip=tf.cast(gaussian.l2_norm_clip, tf.float32),
        noise_stddev=tf.cast(gaussian.stddev, tf.float32))

  def derive_sample_params(self, global_state):
    return self._query.derive_sample_params(global_state["inner"])

  def initial_sample_state(self, template=None):
    return self._query.initial_sample_state(template)

  def preprocess_record(self, params, record):
    return self._query.preprocess_record(params, record)

  def get_noised_result(self, sample_state, global_state):
    inner = global_state["inner"]
    gaussian = self._sum_state(inner)
    seed = tf.stack([tf.constant(self._seed, tf.int64), global_state["round"]])
    with _noise_seed(seed):
      result, new_inner, event = self._query.get_noised_result(sample_state, inner)
    new_state = collections.OrderedDict(
        inner=new_inner, round=global_state["round"] + 1,
        clip=tf.cast(gaussian.l2_norm_clip, tf.float32),
        noise_stddev=tf.cast(gaussian.stddev, tf.float32))
    return result, new_state, event

  def derive_metrics(self, global_state):
    # Called on the state after the round: the clip and noise that round used.
    return collections.OrderedDict(clip=global_state["clip"],
                                   noise_stddev=global_state["noise_stddev"])


def _seed_gaussians(query: Any) -> None:
  """Makes the GaussianSumQuery objects inside TFF's adaptive query seeded."""
  for inner in privacy.adaptive_clip_gaussians(query):
    inner.__class__ = SeededGaussianSumQuery


def gaussian_factory(params, inner: tff.aggregators.UnweightedAggregationFactory,
                     context) -> tff.aggregators.UnweightedAggregationFactory:
  """TFF's DifferentiallyPrivateFactory (fixed or adaptive clip) with seeded noise.

  `params` is a `DpGaussianParams` with `clip` set; `inner` sums the clipped
  records (e.g. an encoded sum); the mean divides by `clients_per_round`.
  """
  cpr = float(context.clients_per_round)
  seed = (context.seed << 8) + context.index  # one stream per stage of the run
  if params.adaptive:
    value_noise, count_stddev = privacy.adaptive_clip_noise_params(
        params.noise_multiplier, cpr, params.clipped_count_stddev)
    adaptive = tfp.QuantileAdaptiveClipSumQuery(
        initial_l2_norm_clip=params.clip, noise_multiplier=value_noise,
        target_unclipped_quantile=params.target_quantile,
        learning_rate=params.learning_rate, clipped_count_stddev=count_stddev,
        expected_num_records=cpr, geometric_update=True)
    _seed_gaussians(adaptive)
    query = SeededQuery(tfp.NormalizedQuery(adaptive, denominator=cpr), seed,
                        lambda s: s.numerator_state.sum_state)
  else:
    gaussian = SeededGaussianSumQuery(l2_norm_clip=params.clip,
                                      stddev=params.clip * params.noise_multiplier)
    query = SeededQuery(tfp.NormalizedQuery(gaussian, denominator=cpr), seed,
                        lambda s: s.numerator_state)
  return tff.aggregators.DifferentiallyPrivateFactory(query, record_aggregation_factory=inner)
