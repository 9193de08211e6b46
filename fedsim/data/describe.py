"""What a built dataset looks like: `fedsim data describe`'s text and label plot.

The command itself, which reads a config, is fedsim/describe_data.py.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from fedsim.data.federated import FederatedData

MAX_PLOTTED_CLIENTS = 50  # more bars than this are unreadable; the first ones are shown
LEGEND_MAX_CLASSES = 20  # more classes get a colour bar instead of a legend


def default_png(logdir: str | os.PathLike, name: str, variant: str | None) -> pathlib.Path:
  """Where `fedsim data describe` puts the plot: the experiment's log directory.

  `<logdir>/<name>/label_distribution.png`, or `label_distribution-<variant>.png`
  for a variant (a `<variant>/` directory would look like one of its runs).
  """
  suffix = f"-{variant}" if variant else ""
  return pathlib.Path(logdir) / name / f"label_distribution{suffix}.png"


def summary(name: str, data: FederatedData, *, seed: int) -> str:
  """`describe`'s text for already built data."""
  stats = data.describe()
  lines = [
      f"dataset: {name} (seed {seed})",
      f"clients: {stats['num_clients']}",
      f"examples: {stats['total_examples']} on clients, {stats['test_examples']} held out"
      + (" (and each client's own test split, held out of its training examples)"
         if data.client_test is not None else ""),
      f"input shape: {stats['input_shape']}, dtype {data.test.x.dtype};"
      f" classes: {stats['num_classes']}",
  ]
  for what in ("examples_per_client", "labels_per_client"):
    q = stats[what]
    sampled = stats["labels_sampled_clients"] if what == "labels_per_client" else None
    lines.append(f"{what.replace('_', ' ')}: " + ", ".join(
        f"{k} {v:g}" for k, v in q.items())
        + (f" (a seeded sample of {sampled} clients)" if sampled else ""))
  return "\n".join(lines)


def label_counts(data: FederatedData, clients: Sequence[str]) -> np.ndarray:
  """int64 [len(clients), num_classes]: label occurrences (every position of a sequence)."""
  return np.stack([np.bincount(np.ravel(data.clients[c].y), minlength=data.num_classes)
                   [:data.num_classes] for c in clients])


def plot_labels(data: FederatedData, out_png: str | os.PathLike, *, title: str) -> None:
  """Writes a PNG: per client, a bar of height #examples split by label share."""
  from matplotlib import pyplot as plt
  fig = label_figure(data, title=title)
  fig.savefig(out_png, dpi=100)
  plt.close(fig)


def label_figure(data: FederatedData, *, title: str):
  """The matplotlib Figure of `plot_labels`: stacked label shares per client.

  Classes are keyed by a legend (up to LEGEND_MAX_CLASSES) or a colour bar.
  """
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
  norm = matplotlib.colors.Normalize(0, max(data.num_classes - 1, 1))
  for label in range(data.num_classes):
    ax.bar(np.arange(len(clients)), shares[:, label], bottom=bottom, width=0.9,
           color=colors(norm(label)), label=str(label))
    bottom += shares[:, label]
  shown = "" if len(clients) == len(data.client_ids) else f", first {len(clients)}"
  ax.set(xlabel=f"client ({len(data.client_ids)} clients{shown})", ylabel="examples",
         title=f"{title}: labels per client")
  ax.set_xticks([])
  if data.num_classes <= LEGEND_MAX_CLASSES:
    ax.legend(title="class", loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small",
              ncol=1 if data.num_classes <= 10 else 2)
  else:  # a legend of 62 or 100 swatches would dwarf the plot
    fig.colorbar(matplotlib.cm.ScalarMappable(norm, colors), ax=ax, label="class")
  fig.tight_layout()
  return fig
