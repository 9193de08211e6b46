"""The run loop's callbacks, and the order a run calls them in.

`on_start` and `after_round` go down the list, `on_end` and `on_error` up it
(see `base`). The order is the contract:

0. ExperimentBoard: on_end only, so last: once the status reads
   'completed', the experiment's TensorBoard comparison (HParams sessions,
   custom-scalars layout, figure) is refreshed.
1. Status: 'running' before anything else; 'completed' after every file is
   flushed, or why the run failed once every sink is closed.
2. Evaluation: adds `eval/*` to the round's metrics, so it comes before the
   callbacks that log them.
3. CsvLogs: metrics.csv and clients.csv; on resume, cut back to the
   checkpoint and read back into `run.history`.
4. TensorBoard: rewinds its event files on resume, then reads `run.history`.
5. ProgressBar.
6. Checkpoints: after the logs, so a checkpoint of round R comes with every
   row up to R.
7. OnRound: the user's callback sees a round logged and checkpointed.
8. FinalModel: the model is exported at the end.
"""

from __future__ import annotations

from typing import Callable

from fedsim.experiment.callbacks.base import Callback, CallbackList
from fedsim.experiment.callbacks.checkpoints import Checkpoints
from fedsim.experiment.callbacks.csv_logs import CLIENTS_CSV, METRICS_CSV, CsvLogs
from fedsim.experiment.callbacks.evaluation import Evaluation
from fedsim.experiment.callbacks.final_model import FINAL_MODEL, FinalModel
from fedsim.experiment.callbacks.board import ExperimentBoard
from fedsim.experiment.callbacks.on_round import OnRound
from fedsim.experiment.callbacks.progress import ProgressBar
from fedsim.experiment.callbacks.status import Status
from fedsim.experiment.callbacks.tensorboard import TensorBoard

__all__ = ["CLIENTS_CSV", "FINAL_MODEL", "METRICS_CSV", "Callback", "CallbackList",
           "standard_callbacks"]


def standard_callbacks(progress: bool | None = None,
                       check_runtime: Callable[[str], None] | None = None,
                       on_round: Callable[..., None] | None = None) -> CallbackList:
  """Every callback of a run, in the order above.

  Args:
    progress: the progress bar on/off; None shows it only on a terminal.
    check_runtime: `check_runtime(during)` raises RunFailed if the runtime died.
    on_round: the user's `on_round(round, metrics, info)`, if any.
  """
  callbacks = [ExperimentBoard(), Status(check_runtime), Evaluation(), CsvLogs(), TensorBoard(),
               ProgressBar(progress), Checkpoints()]
  if on_round is not None:
    callbacks.append(OnRound(on_round))
  return CallbackList([*callbacks, FinalModel()])
