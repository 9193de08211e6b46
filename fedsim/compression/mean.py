"""Encoded mean: clients encode their (weighted) update, the server decodes and averages.

In the weighted case TFF's MeanFactory multiplies each update by its weight on
the client before the encoded sum, so the quantization range of a client is
that of its weighted update; the decoded sum is divided by the sum of weights.
"""

from __future__ import annotations

import tensorflow_federated as tff

from fedsim.compression import DirectionSpec
from fedsim.compression import tensor_encoding_api as te_api
from fedsim.compression.encoders import encoder_for


def build_encoded_mean(
    spec: DirectionSpec | None, weighted: bool = True,
) -> tff.aggregators.WeightedAggregationFactory | tff.aggregators.UnweightedAggregationFactory:
  """An aggregation factory for the mean of client values, encoded per `spec`.

  Args:
    spec: the aggregation direction; None gives TFF's plain (float) mean.
    weighted: a weighted mean (`MeanFactory`, e.g. for FedAvg's
      `model_aggregator`) or an unweighted one (`UnweightedMeanFactory`).

  Returns:
    The factory. Its processes keep the encoders' state as their state; the
    weights are summed unencoded.
  """
  value_sum = build_encoded_sum(spec)  # SumFactory, TFF's default, when spec is None
  if weighted:
    return tff.aggregators.MeanFactory(value_sum)
  return tff.aggregators.UnweightedMeanFactory(value_sum)


def build_encoded_sum(spec: DirectionSpec | None) -> tff.aggregators.UnweightedAggregationFactory:
  """An aggregation factory for the plain sum of client values, encoded per `spec`
  (elastic averaging adds the clients' elastic differences, it does not average)."""
  if spec is None:
    return tff.aggregators.SumFactory()

  def gather_encoder_for(tensor_spec):
    return te_api.gather_encoder(encoder_for(tensor_spec, spec), tensor_spec)

  return te_api.encoded_sum_factory(gather_encoder_for)
