"""`fedsim data describe CONFIG`: what the config's dataset looks like, as text and a plot.

Builds the dataset exactly as a run would (same seed and parameters) without
building a model or starting TFF.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from fedsim.data import DATASETS
from fedsim.data.federated import FederatedData

MAX_PLOTTED_CLIENTS = 50  # more bars than this are unreadable; the first ones are shown


def describe(config_path: str | os.PathLike, overrides: Sequence[str] = (),
             out_png: str | os.PathLike | None = None) -> str:
  """The text summary of the config's dataset; writes a label-distribution PNG.

  Args:
    config_path: experiment YAML (or a config mapping).
    overrides: `dotted.key=value` strings, as `--set`.
    out_png: where to write the plot (one stacked bar of label shares per
      client), or None for no plot.

  Returns:
    Lines of text: dataset name and parameters, clients, examples, input
    shape, classes, and min/p10/median/p90/max of examples and of distinct
    labels per client.

  Raises:
    UserError: bad config or data files (as a run would raise).
  """
  from fedsim.config.loader import load_config
  config, _ = load_config(config_path, overrides)
  data = DATASETS.get(config.data.name).build(config.data.params, config.seed)
  text = summary(config.data.name, data, seed=config.seed)
  if out_png is not None:
    plot_labels(data, out_png, title=f"{config.data.name} (seed {config.seed})")
    text += f"\nlabel plot: {out_png}"
  return text


def summary(name: str, data: FederatedData, *, seed: int) -> str:
  """`describe`'s text for already built data."""
  stats = data.describe()
  lines = [
      f"dataset: {name} (seed {seed})",
      f"clients: {stats['num_clients']}",
      f"examples: {stats['total_examples']} on clients, {stats['test_examples']} held out",
      f"input shape: {stats['input_shape']}, dtype {data.test.x.dtype};"
      f" classes: {stats['num_classes']}",
  ]
  for what in ("examples_per_client", "labels_per_client"):
    q = stats[what]
    lines.append(f"{what.replace('_', ' ')}: " + ", ".join(
        f"{k} {v:g}" for k, v in q.items()))
  return "\n".join(lines)


def label_counts(data: FederatedData, clients: Sequence[str]) -> np.ndarray:
  """int64 [len(clients), num_classes]: label occurrences (every position of a sequence)."""
  return np.stack([np.bincount(np.ravel(data.clients[c].y), minlength=data.num_classes)
                   [:data.num_classes] for c in clients])


def plot_labels(data: FederatedData, out_png: str | os.PathLike, *, title: str) -> None:
  """Writes a PNG: per client, a bar of height #examples split by label share."""
  import matplotlib
  matplotlib.use("Agg")  # files only; never a display
  from matplotlib import pyplot as plt

  clients = list(data.client_ids[:MAX_PLOTTED_CLIENTS])
  counts = label_counts(data, clients)
  sizes = np.array([len(data.clients[c]) for c in clients])
  shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1) * sizes[:, None]
  colors = plt.get_cmap("tab20" if data.num_classes <= 20 else "viridis")
  fig, ax = plt.subplots(figsize=(max(6.0, 0.18 * len(clients) + 2), 3.5))
  bottom = np.zeros(len(clients))
  for label in range(data.num_classes):
    ax.bar(np.arange(len(clients)), shares[:, label], bottom=bottom, width=0.9,
           color=colors(label / max(data.num_classes - 1, 1)))
    bottom += shares[:, label]
  shown = "" if len(clients) == len(data.client_ids) else f", first {len(clients)}"
  ax.set(xlabel=f"client ({len(data.client_ids)} clients{shown})", ylabel="examples",
         title=f"{title}: labels per client")
  ax.set_xticks([])
  fig.tight_layout()
  fig.savefig(out_png, dpi=100)
  plt.close(fig)
