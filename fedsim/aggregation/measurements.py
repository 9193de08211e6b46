"""Stage measurements as flat, named metrics (pure Python, no TensorFlow).

A composed round returns measurements nested by stage (distributor, client
work, aggregator, finalizer), and TFF's aggregation factories nest each
inner factory's measurements inside their own. These functions flatten them
to `stage/path/to/value` keys, naming aggregation stages as the chain does
(`aggregation/clip/clipped_count`), for metrics.csv and TensorBoard.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterator, Mapping, Sequence

import numpy as np


def _items(node: Any) -> Iterator[tuple[str, Any]]:
  if isinstance(node, Mapping):
    yield from ((str(k), v) for k, v in node.items())
  elif hasattr(node, "_asdict"):
    yield from node._asdict().items()
  elif hasattr(node, "__attrs_attrs__"):
    yield from ((a.name, getattr(node, a.name)) for a in node.__attrs_attrs__)
  elif isinstance(node, (list, tuple)):
    yield from ((str(i), v) for i, v in enumerate(node))


def flatten(node: Any, prefix: str) -> dict[str, float]:
  """Every scalar number under `node` as `prefix/key/...` -> float (tensors with
  more than one element and empty structures are left out)."""
  if isinstance(node, (numbers.Number, np.generic)) or (
      isinstance(node, np.ndarray) and node.size == 1):
    return {prefix: float(np.asarray(node).reshape(()))}
  out: dict[str, float] = {}
  for key, value in _items(node):
    out.update(flatten(value, f"{prefix}/{key}"))
  return out


def aggregation_metrics(plan: Sequence[tuple[str, str | None, str | None]],
                        measurements: Any, prefix: str = "aggregation") -> dict[str, float]:
  """The aggregator's measurements, named by chain stage.

  `plan` is the chain's ((stage name, inner key, own key), ...) from the top
  down (see `chain.build_chain`): a stage owns the value under its own key if
  it has one, else every key of its node but the inner key; the inner key's
  value is the next stage's node.
  """
  out: dict[str, float] = {}
  node = measurements
  for name, inner_key, own_key in plan:
    if node is None:
      break
    items = dict(_items(node))
    own = _items(items.get(own_key)) if own_key else (
        (k, v) for k, v in items.items() if k != inner_key)
    for key, value in own:
      out.update(flatten(value, f"{prefix}/{name}/{key}"))
    node = items.get(inner_key) if inner_key else None
  return out
