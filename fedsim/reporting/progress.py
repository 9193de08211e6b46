"""A terminal progress bar for a run: rounds done, eval accuracy, time left."""

from __future__ import annotations

import sys
from typing import Mapping

import tqdm

from fedsim.metric_names import EVAL_ACCURACY


class Progress:
  """Shows rounds done / total, the last eval accuracy and the time left.

  Prints nothing at all unless enabled; by default it is enabled only when
  stdout is a terminal, so logs and pipes stay clean. The bar goes to stdout,
  the stream that decision was made on.
  """

  def __init__(self, total_rounds: int, enabled: bool | None = None, start_round: int = 0):
    """Opens the bar (or nothing, when disabled).

    Args:
      total_rounds: rounds of the whole run.
      enabled: True/False to force; None shows the bar only on a terminal.
      start_round: rounds already done (a resumed run).
    """
    if enabled is None:
      enabled = sys.stdout.isatty()
    self._accuracy: float | None = None
    self._bar = None
    if enabled:
      self._bar = tqdm.tqdm(total=total_rounds, initial=start_round, unit="round",
                            file=sys.stdout, dynamic_ncols=True)

  def update(self, round_num: int, metrics: Mapping[str, float]) -> None:
    """Marks rounds up to `round_num` (1-based: the round just finished) done."""
    if self._bar is None:
      return
    if EVAL_ACCURACY in metrics:
      self._accuracy = float(metrics[EVAL_ACCURACY])
    if self._accuracy is not None:
      self._bar.set_postfix_str(f"eval acc {self._accuracy:.4f}", refresh=False)
    self._bar.update(round_num - self._bar.n)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None
