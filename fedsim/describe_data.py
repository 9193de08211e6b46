"""`fedsim data describe CONFIG`: what the config's dataset looks like, as text and a plot.

Reads the config as a run would (overrides, variants, seeds) and builds the
dataset with the same seed and parameters, less what `eval.federated` holds
out of each client's training data, without building a model or starting
TFF; the text and the plot are data/describe.py's.
"""

from __future__ import annotations

import os
import pathlib
from typing import Sequence

from fedsim.data.describe import default_png, plot_labels, summary
from fedsim.experiment.config.loader import expand_variants
from fedsim.experiment.config.variant_overrides import load_for_variant
from fedsim.experiment.population import training_data


def describe(config_path: str | os.PathLike, overrides: Sequence[str] = (),
             out_png: str | os.PathLike | None = None, *, variant: str | None = None,
             logdir: str | os.PathLike | None = None) -> str:
  """The text summary of the config's dataset; writes a label-distribution PNG.

  Args:
    config_path: experiment YAML (or a config mapping).
    overrides: `dotted.key=value` strings, as `--set`.
    out_png: where to write the plot (one stacked bar of label shares per
      client, colours keyed by class), or None.
    variant: describe this variant of the config (default: the base config).
    logdir: with `out_png` None, write the plot to `default_png(logdir, ...)`
      in the experiment's log directory instead; both None: no plot.

  Returns:
    Lines of text: dataset name and parameters, clients, examples, input
    shape, classes, and min/p10/median/p90/max of examples and of distinct
    labels per client; then where the plot went, and which variants change
    the data when the base config was described.

  Raises:
    UserError: bad config or data files (as a run would raise), or an
      unknown `variant`.
  """
  raw = load_for_variant(config_path, overrides, variant)  # --set over the variant, as a run
  # With `seeds`, the data of the first seed.
  _, config = expand_variants(raw if variant else {**raw, "variants": {}}, only=variant)[0]
  data = training_data(config)   # as the run trains on it: less eval.federated's hold-out
  text = summary(config.data.name, data, seed=config.seed)
  if out_png is None and logdir is not None:
    out_png = default_png(logdir, config.name, variant)
  if out_png is not None:
    pathlib.Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    title = f"{config.data.name} (seed {config.seed})"
    plot_labels(data, out_png, title=f"{variant}: {title}" if variant else title)
    text += f"\nlabel plot: {out_png}"
  changing = [name for name, override in (raw.get("variants") or {}).items()
              if {"data", "seed"} & set(override or {})
              or "federated" in ((override or {}).get("eval") or {})]
  if variant is None and changing:
    text += (f"\nvariants with other data: {', '.join(changing)}"
             " (describe one with --variant NAME)")
  return text
