"""Once a run has completed, the experiment's views in TensorBoard are
refreshed (`fedsim.reporting.board`): every completed run's HParams session
and ranking metrics, the custom-scalars layout, the comparison figure.

First in the list, so that its `on_end` comes last, after the run's status
reads 'completed': the figure and the HParams table are of completed runs.
A failure here is a warning: every file of the run itself is written.
"""

from __future__ import annotations

import sys

from fedsim.errors import UserError
from fedsim.experiment.callbacks.callback import Callback
from fedsim.experiment.run_state import Run
from fedsim.reporting import board


class ExperimentBoard(Callback):

  def on_end(self, run: Run) -> None:
    try:
      board.refresh(run.run_dir.parent)
    except (OSError, UserError) as e:
      print(f"fedsim: warning: TensorBoard comparison of {run.run_dir.parent} not refreshed:"
            f" {e}", file=sys.stderr)
