"""Assembles a parsed chain of stages into one `tff.aggregators` factory.

Stages are listed outermost first. The factory is built from the bottom up:

  1. the sum: the last stage if it is a `sum` stage (e.g. `encode`), else
     TFF's SumFactory, wrapped by the `wrap` stages between the mean and it;
  2. the mean level: an explicit `mean` stage, a `private` stage (it clips,
     noises and averages), a `complete` stage, or else the algorithm's own
     combination inserted right above the sum: `MeanFactory` (weighted by the
     clients' update weights), `UnweightedMeanFactory`, or nothing (a sum);
  3. the `wrap` stages above the mean, innermost first.

Alongside the factory comes the measurement plan: for each stage, top-down,
its name and the key under which its measurements nest the next stage's, so
the run loop can report `aggregation/<stage>/<measurement>`.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow_federated as tff

from fedsim.aggregation import (AGGREGATION_STAGES, COMPLETE, MEAN, PLAIN_SUM, PRIVATE, SUM,
                                WEIGHTED_MEAN, StageContext, measurement_keys, role_of)
from fedsim.aggregation.builtin_stages import absorb_clip
from fedsim.config.typed import Component
from fedsim.errors import UserError

# TFF's means nest their value sum's measurements under this key.
_MEAN_INNER_KEY = "mean_value"


def build_chain(stages: Sequence[Component], kind: str, clients_per_round: int,
                seed: int) -> tuple[Any, tuple[tuple[str, str | None, str | None], ...]]:
  """The factory for `stages` and its measurement plan.

  Args:
    stages: the parsed chain, outermost first (checked by `check_chain`).
    kind: how the algorithm combines client updates: WEIGHTED_MEAN,
      UNWEIGHTED_MEAN or PLAIN_SUM.
    clients_per_round: the expected number of aggregated clients (the
      denominator of differentially private means).
    seed: the run seed; stages derive their randomness from it.

  Returns:
    (factory, plan): a Weighted- or UnweightedAggregationFactory, and
    ((stage name, inner key, own key), ...) from the top down (see
    `measurements.aggregation_metrics`).
  """
  stages = absorb_clip(stages)
  roles = [role_of(s) for s in stages]
  names = _unique_names(stages)

  def context(i: int) -> StageContext:
    return StageContext(kind, clients_per_round, seed, i)

  def build(i: int, *inner):
    return AGGREGATION_STAGES.get(stages[i].name).build(stages[i].params, *inner, context(i))

  levels = [i for i, r in enumerate(roles) if r in (MEAN, PRIVATE, COMPLETE)]
  sums = [i for i, r in enumerate(roles) if r == SUM]
  explicit = bool(levels)
  mean_at = levels[0] if explicit else (sums[0] if sums else len(stages))
  below = range(mean_at + 1 if explicit else mean_at, len(stages))

  plan: list[tuple[str, str | None, str | None]] = []
  factory = None
  for i in reversed(below):
    factory = build(i) if roles[i] in (SUM, COMPLETE) else build(i, factory or _sum())
  factory = factory or _sum()
  if explicit:
    factory = build(mean_at) if roles[mean_at] == COMPLETE else build(mean_at, factory)
  elif kind != PLAIN_SUM:
    factory = (tff.aggregators.MeanFactory(factory) if kind == WEIGHTED_MEAN
               else tff.aggregators.UnweightedMeanFactory(factory))
  for i in reversed(range(mean_at)):
    factory = build(i, factory)

  for i in range(len(stages)):
    if i == mean_at and not explicit and kind != PLAIN_SUM:
      plan.append(("mean", _MEAN_INNER_KEY, None))
    plan.append((names[i], *measurement_keys(stages[i])))
  if mean_at == len(stages) and kind != PLAIN_SUM:
    plan.append(("mean", _MEAN_INNER_KEY, None))
  _check_kind(factory, kind, stages)
  return factory, tuple(plan)


def _sum():
  return tff.aggregators.SumFactory()


def _unique_names(stages: Sequence[Component]) -> list[str]:
  """Stage names, with a repeated name numbered from its second use (clip, clip_2)."""
  seen: dict[str, int] = {}
  out = []
  for stage in stages:
    seen[stage.name] = seen.get(stage.name, 0) + 1
    out.append(stage.name if seen[stage.name] == 1 else f"{stage.name}_{seen[stage.name]}")
  return out


def _check_kind(factory, kind: str, stages: Sequence[Component]) -> None:
  """A user factory of the wrong kind fails here with one line, not in TFF's types."""
  weighted = isinstance(factory, tff.aggregators.WeightedAggregationFactory)
  unweighted = isinstance(factory, tff.aggregators.UnweightedAggregationFactory)
  if not (weighted or unweighted):
    raise UserError(f"aggregation: the chain built a {type(factory).__name__}, not a"
                    " tff.aggregators factory")
  if weighted != (kind == WEIGHTED_MEAN):
    names = ", ".join(s.name for s in stages) or "(empty)"
    built, need = ("weighted", "unweighted") if weighted else ("unweighted", "weighted")
    how = {WEIGHTED_MEAN: "averages client updates weighted by their examples",
           UNWEIGHTED_MEAN: "averages client updates unweighted",
           PLAIN_SUM: "sums client updates"}[kind]
    raise UserError(f"aggregation: the chain [{names}] builds a {built} aggregation, but the"
                    f" algorithm {how} and needs an {need} one")


def build_broadcast(stages: Sequence[Component], weights_type, seed: int):
  """The DistributionProcess for the broadcast chain (plain broadcast when empty)."""
  from fedsim.aggregation import BROADCAST_STAGES
  if not stages:
    return tff.learning.templates.build_broadcast_process(weights_type)
  stage = stages[0]
  context = StageContext(kind="", clients_per_round=0, seed=seed, index=0)
  return BROADCAST_STAGES.get(stage.name).build(stage.params, weights_type, context)

