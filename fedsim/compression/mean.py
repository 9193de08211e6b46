"""Encoded mean: clients encode their (weighted) update, the server decodes and averages.

In the weighted case TFF's MeanFactory multiplies each update by its weight on
the client before the encoded sum, so the quantization range of a client is
that of its weighted update; the decoded sum is divided by the sum of weights.
"""

from __future__ import annotations

import tensorflow_federated as tff

from fedsim.compression import DirectionSpec
from fedsim.compression.encoded_sum import EncodedSumFactory
from fedsim.compression.encoders import encoder_at


def build_encoded_mean(
    spec: DirectionSpec | None, weighted: bool = True, seed: int = 0,
) -> tff.aggregators.WeightedAggregationFactory | tff.aggregators.UnweightedAggregationFactory:
  """An aggregation factory for the mean of client values, encoded per `spec`.

  Args:
    spec: the aggregation direction; None gives TFF's plain (float) mean.
    weighted: a weighted mean (`MeanFactory`, e.g. for FedAvg's
      `model_aggregator`) or an unweighted one (`UnweightedMeanFactory`).
    seed: the run seed, salting the encoders' noise (see `build_encoded_sum`).

  Returns:
    The factory. Its processes keep the encoders' state as their state; the
    weights are summed unencoded.
  """
  value_sum = build_encoded_sum(spec, seed)  # SumFactory, TFF's default, when spec is None
  if weighted:
    return tff.aggregators.MeanFactory(value_sum)
  return tff.aggregators.UnweightedMeanFactory(value_sum)


def build_encoded_sum(spec: DirectionSpec | None,
                      seed: int = 0) -> tff.aggregators.UnweightedAggregationFactory:
  """An aggregation factory for the plain sum of client values, encoded per `spec`
  (elastic averaging adds the clients' elastic differences, it does not average).

  The encoders' random draws are seeded by (`seed`, the round, the tensor's
  flat index in the value, the values encoded): see
  `noise_seeds.noise_seed`; with `spec.error_feedback` the round is
  left out, since the client reproduces its encoding without it. The
  server measures what each client sent (measurement `wire`, see
  `fedsim.compression.encoded_sum`).
  """
  if spec is None:
    return tff.aggregators.SumFactory()

  # Error feedback's clients re-encode their value without knowing the round.
  return EncodedSumFactory(lambda tensor_spec, index: encoder_at(tensor_spec, spec, seed, index),
                           round_noise=not spec.error_feedback,
                           lossless=spec.lossless == "huffman")
