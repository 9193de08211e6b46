"""Checkpoints every `checkpoint.every` rounds and after the last (see
`fedsim.state.checkpoint`); a run resumes from the newest. A run a
callback stopped early is checkpointed at the round it stopped after, so it
can be resumed (extended) from there.

It runs after the callbacks that log a round: a checkpoint of round R
promises that metrics.csv holds every round up to R.
"""

from __future__ import annotations

from fedsim.experiment.async_loop import ASYNC_STATE
from fedsim.experiment.callbacks.callback import Callback
from fedsim.experiment.round_result import RoundResult
from fedsim.experiment.run_state import Run
from fedsim.state.checkpoint import save_checkpoint


class Checkpoints(Callback):

  def __init__(self):
    self._saved = None  # the round of this run's newest checkpoint

  def after_round(self, run: Run, record: RoundResult) -> None:
    config = run.sim.config
    if run.round_num % config.checkpoint.every == 0 or run.round_num == config.rounds:
      self._save(run)

  def on_end(self, run: Run) -> None:
    if run.stopped_by is not None and self._saved != run.round_num:
      self._save(run)  # the round a callback stopped the run after is its last

  def _save(self, run: Run) -> None:
    config = run.sim.config
    if run.states is not None:
      run.states.flush()  # the checkpoint links the directory: it must hold this round's states
    save_checkpoint(run.run_dir, run.round_num, run.state, run.simulated_seconds,
                    run.sizes.broadcast_history, run.sizes.aggregate_history,
                    config.checkpoint.keep,
                    run.states.directory if run.states is not None else None,
                    extra_npz={ASYNC_STATE: run.player.checkpoint_arrays()}
                    if run.player is not None else None,
                    control_state=run.control_state)
    self._saved = run.round_num
