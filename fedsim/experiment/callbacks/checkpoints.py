"""Checkpoints every `checkpoint.every` rounds and after the last (see
`fedsim.state.checkpoint`); a run resumes from the newest. A run a
callback stopped early is checkpointed at the round it stopped after, so it
can be resumed (extended) from there.

It runs after the callbacks that log a round: a checkpoint of round R
promises that metrics.csv holds every round up to R. The checkpoint is taken
there and written while the next round runs (`checkpoint_writer`); `durable`
is the callback, placed before the logs, that waits for it: nothing of round
R+1 is logged before the checkpoint of round R is on disk. The user's code
(`on_round`, `callbacks=`) runs after another such wait, so it sees each round
logged and its checkpoint on disk.
"""

from __future__ import annotations

from fedsim.experiment.async_loop import ASYNC_STATE
from fedsim.experiment.callbacks.callback import Callback
from fedsim.experiment.round_result import RoundResult
from fedsim.experiment.run_state import Run
from fedsim.state.checkpoint import stage_checkpoint
from fedsim.state.checkpoint_writer import CheckpointWriter


class Checkpoints(Callback):

  def __init__(self):
    self._saved = None  # the round of this run's newest checkpoint
    self._writer = CheckpointWriter()
    self.durable = self.waiter()

  def waiter(self) -> Callback:
    """A callback that waits for the newest checkpoint taken to be on disk."""
    return _Durable(self._writer)

  def after_round(self, run: Run, record: RoundResult) -> None:
    config = run.sim.config
    if run.round_num % config.checkpoint.every == 0 or run.round_num == config.rounds:
      self._save(run)

  def on_end(self, run: Run) -> None:
    if run.stopped_by is not None and self._saved != run.round_num:
      self._save(run)  # the round a callback stopped the run after is its last
    self._writer.close()  # before 'completed'

  def on_error(self, run: Run, error: BaseException) -> None:
    self._writer.close(quietly=True)  # before 'failed': the newest checkpoint is settled

  def _save(self, run: Run) -> None:
    config = run.sim.config
    self._writer.settle()  # staging must follow the previous write's deletions
    if run.states is not None:
      run.states.flush()  # the checkpoint links the directory: it must hold this round's states
    self._writer.submit(stage_checkpoint(
        run.run_dir, run.round_num, run.state, run.simulated_seconds,
        run.sizes.broadcast_history, run.sizes.aggregate_history, config.checkpoint.keep,
        run.states.directory if run.states is not None else None,
        extra_npz={ASYNC_STATE: run.player.checkpoint_arrays()}
        if run.player is not None else None,
        control_state=run.control_state))
    self._saved = run.round_num


class _Durable(Callback):
  """Waits, before a round is logged, for the checkpoint of an earlier round
  to be on disk (and raises the error its write failed with, if it did)."""

  def __init__(self, writer: CheckpointWriter):
    self._writer = writer

  @property
  def name(self) -> str:
    return "Checkpoints.durable"

  def after_round(self, run: Run, record: RoundResult) -> None:
    self._writer.wait()
