"""Runs of one variant under several seeds: grouping, means and 95% intervals.

Runs belong together when their resolved configs are equal except for
`seed` and `seeds` (what `seeds: [...]` or `--seeds` produces: a seed run
later with `--seeds 3,4` joins the runs of seeds 0-2). The interval is Student's t over
seeds: mean +- t(0.975, n - 1) * s / sqrt(n), with s the sample standard
deviation (ddof 1) of the n seeds' values; it needs n >= 2.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

import numpy as np

from fedsim.metric_names import EVAL_ACCURACY, ROUND, bits_sent

CONFIDENCE = 0.95
# '<variant>-seed<N>' or, without variants, 'seed<N>'; '-<k>' marks a rerun.
_SEED_NAME = re.compile(r"(?:^|-)seed\d+(?:-\d+)?$")


@dataclasses.dataclass(frozen=True)
class SeedGroup:
  """The runs of one variant, one per seed (in run order)."""

  label: str
  seeds: tuple[int, ...]
  runs: tuple[Any, ...]  # compare.Run


def mean_interval(values: Sequence[float]) -> tuple[float, float | None]:
  """(mean, half-width of the 95% t-interval); half-width None for fewer than 2 values."""
  values = np.asarray(values, dtype=np.float64)
  mean = float(values.mean())
  if len(values) < 2:
    return mean, None
  from scipy import stats  # pylint: disable=g-import-not-at-top
  t = stats.t.ppf(0.5 + CONFIDENCE / 2, len(values) - 1)
  return mean, float(t * values.std(ddof=1) / np.sqrt(len(values)))


def _key(config: Mapping[str, Any]) -> str:
  # `seeds` lists the seeds of the command that made the run, not what it computed.
  rest = {k: v for k, v in config.items() if k not in ("seed", "seeds")}
  return json.dumps(rest, sort_keys=True, default=str)


def group_by_seed(runs: Sequence[Any]) -> list[SeedGroup]:
  """Groups `runs` (compare.Run) whose configs differ only by `seed`, in run order.

  A seed run more than once is represented by its newest completed run (else
  its newest); the other runs of that seed stay groups of their own, so no
  run disappears from a comparison. A group of several seeds is labelled
  with its first run's name without '-seed<N>' (the experiment name for
  'seed<N>'); a group of one run keeps the run's name.
  """
  order = {id(run): i for i, run in enumerate(runs)}
  by_key: dict[str, dict[int, Any]] = {}
  extra = []
  for run in sorted(runs, key=lambda r: (r.status == "completed", order[id(r)])):
    seeds = by_key.setdefault(_key(run.config), {})
    seed = int(run.config.get("seed", 0))
    if seed in seeds:
      extra.append(seeds[seed])  # superseded by a completed or newer run of the seed
    seeds[seed] = run
  groups = [sorted(seeds.items(), key=lambda item: order[id(item[1])])
            for seeds in by_key.values()]
  groups += [[(int(run.config.get("seed", 0)), run)] for run in extra]
  groups.sort(key=lambda members: order[id(members[0][1])])
  out = []
  for members in groups:
    first = members[0][1]
    label = first.name
    if len(members) > 1:
      label = _SEED_NAME.sub("", first.name) or str(first.config.get("name", first.name))
    out.append(SeedGroup(label, tuple(s for s, _ in members), tuple(r for _, r in members)))
  return out


def curve(group: SeedGroup, x: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(x, mean accuracy, interval half-width) at the eval rounds every seed reached.

  `x` is 'rounds' or 'bits' (the seeds' mean cumulative bits both ways at that
  round). The half-width is 0 for a single seed.
  """
  per_run = []
  for run in group.runs:
    per_run.append({row[ROUND]: (row[EVAL_ACCURACY], bits_sent(row))
                    for row in run.metrics if EVAL_ACCURACY in row})
  rounds = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
  xs, means, halves = [], [], []
  for r in rounds:
    accuracy = [p[r][0] for p in per_run]
    mean, half = mean_interval(accuracy)
    xs.append(r if x == "rounds" else float(np.mean([p[r][1] for p in per_run])))
    means.append(mean)
    halves.append(half or 0.0)
  return np.asarray(xs, float), np.asarray(means), np.asarray(halves)
