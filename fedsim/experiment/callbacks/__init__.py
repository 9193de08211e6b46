"""The run loop's callbacks, and the order a run calls them in.

`on_start` and `after_round` go down the list, `on_end` and `on_error` up it
(see `callback`). The order is the contract:

0. ExperimentBoard: on_end only, so last: once the status reads
   'completed', the experiment's TensorBoard comparison (HParams sessions,
   custom-scalars layout, figure) is refreshed.
1. Status: 'running' before anything else; 'completed' after every file is
   flushed, or why the run failed once every sink is closed.
2. Evaluation: adds `eval/*` to the round's metrics, so it comes before the
   callbacks that log them.
   Then `Checkpoints.durable`: waits until the checkpoint of an earlier round,
   written while this round ran, is on disk (see `checkpoint_writer`).
3. CsvLogs: metrics.csv and clients.csv; on resume, cut back to the
   checkpoint and read back into `run.history`.
4. TensorBoard: rewinds its event files on resume, then reads `run.history`.
5. ProgressBar.
6. Checkpoints: after the logs, so a checkpoint of round R comes with every
   row up to R; taken here, written while the next round runs.
7. OnRound, then the user's `callbacks=` in the order given, after a wait
   for the round's checkpoint (only when there is user code): each sees a
   round logged (with its evaluation, on evaluation rounds) and its
   checkpoint on disk, and may stop the run there (see `callback`); at the end, they see the status
   still 'running' and every sink open.
8. FinalModel: the model is exported at the end, before the user's `on_end`.
"""

from __future__ import annotations

from typing import Callable, Sequence

from fedsim.experiment.callbacks.callback import Callback, CallbackList, UserCallback

__all__ = ["Callback", "CallbackList", "UserCallback", "standard_callbacks"]


def standard_callbacks(progress: bool | None = None,
                       check_runtime: Callable[[str], None] | None = None,
                       on_round: Callable[..., None] | None = None,
                       user: Sequence[Callback] = ()) -> CallbackList:
  """Every callback of a run, in the order above.

  Args:
    progress: the progress bar on/off; None shows it only on a terminal.
    check_runtime: `check_runtime(during)` raises RunFailed if the runtime died.
    on_round: the user's `on_round(round, metrics, info)`, if any.
    user: the user's own callbacks (see `UserCallback` for what they may do).
  """
  # Here, not at the top: the built-ins import the run's TensorFlow side, and
  # `fedsim.Callback` (base) is imported with this package before any run.
  # pylint: disable=g-import-not-at-top
  from fedsim.experiment.callbacks.experiment_board import ExperimentBoard
  from fedsim.experiment.callbacks.checkpoints import Checkpoints
  from fedsim.experiment.callbacks.csv_logs import CsvLogs
  from fedsim.experiment.callbacks.evaluation import Evaluation
  from fedsim.experiment.callbacks.final_model import FinalModel
  from fedsim.experiment.callbacks.on_round import OnRound
  from fedsim.experiment.callbacks.progress_bar import ProgressBar
  from fedsim.experiment.callbacks.status_file import Status
  from fedsim.experiment.callbacks.tensorboard import TensorBoard
  checkpoints = Checkpoints()
  callbacks = [ExperimentBoard(), Status(check_runtime), Evaluation(), checkpoints.durable,
               CsvLogs(), TensorBoard(), ProgressBar(progress), checkpoints]
  users = [UserCallback(OnRound(on_round), name="on_round")] if on_round is not None else []
  users += [UserCallback(callback) for callback in user]
  if users:  # the user's code may read the checkpoint: it waits until it is on disk
    callbacks.append(checkpoints.waiter())
  return CallbackList([*callbacks, *users, FinalModel()])
