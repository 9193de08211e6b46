"""Writes a run's checkpoints on a thread of their own, while the next round trains.

Writing a checkpoint is mostly waiting for the disk (a few fsyncs: 2-70 ms
here, by the machine's load), several W2 rounds' worth of the loop's time if
the loop waited for it. The run loop stages a checkpoint after a round
(`checkpoint.stage_checkpoint`: its arrays, bookkeeping and client-state links
are fixed then) and this writer commits it while the next round runs. What a
crash keeps is what it kept when the loop wrote in line:

* One checkpoint is in flight at a time, in round order: the next one is
  staged only once the previous is durable and the checkpoints it replaced
  are deleted (`settle`; the deletions run after `wait` has returned).
* The checkpoint of round R is durable before anything of round R+1 is
  logged (`wait`, called before the logs of every round): whoever sees a
  row of round R+1 in metrics.csv or TensorBoard can count on it, as a
  resume after a kill does.
* A run ends ('completed', or failed / interrupted) only once the write in
  flight has finished. Killed mid-write, the run leaves a temporary
  directory that is never taken as a checkpoint; the previous checkpoint is
  deleted only after the new one is complete, so a resume finds it.

A write that fails (a full disk) is raised in the loop's thread at the next
`wait`, as the error the write raised (a HostError naming the checkpoint).
"""

from __future__ import annotations

import concurrent.futures

from fedsim.state.checkpoint import StagedCheckpoint


class CheckpointWriter:
  """Commits staged checkpoints one at a time on a thread of its own.

  The thread lives from the first `submit` to `close`: starting one per
  checkpoint would make the loop wait for the scheduler to run it (ms on a
  loaded machine).
  """

  def __init__(self):
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._pending: concurrent.futures.Future | None = None   # durable
    self._pruning: concurrent.futures.Future | None = None   # durable, then pruned

  def submit(self, staged: StagedCheckpoint) -> None:
    """Starts writing `staged`, once the write before it is settled.

    The write before must have been waited for (`wait`), and `staged` staged
    after `settle`: the deletions that follow a write delete staging directories.
    """
    if self._pending is not None:
      raise RuntimeError("a checkpoint is still being written; wait() first")
    self.settle()
    if self._pool is None:
      self._pool = concurrent.futures.ThreadPoolExecutor(
          max_workers=1, thread_name_prefix="fedsim-checkpoint")
    durable = self._pending = concurrent.futures.Future()
    durable.set_running_or_notify_cancel()
    self._pruning = self._pool.submit(_write, staged, durable)

  def wait(self) -> None:
    """Returns once the write in flight (if any) is durable.

    Raises:
      HostError: (or whatever the write raised) if it failed; the checkpoint
        before it is then the newest.
    """
    if self._pending is None:
      return
    try:
      self._pending.result()
    finally:
      if self._pending.done():  # not when a signal interrupted the wait
        self._pending = None

  def settle(self) -> None:
    """`wait`, then returns once the checkpoints it replaced are deleted too.

    Raises:
      HostError, OSError: as `wait`, or if the old checkpoints could not be listed.
    """
    try:
      self.wait()
    finally:
      # After a failed write too (nothing to delete then); not after a signal
      # interrupted the wait, which would block here again.
      if self._pruning is not None and self._pending is None:
        try:
          self._pruning.result()
        finally:
          if self._pruning.done():
            self._pruning = None

  def close(self, quietly: bool = False) -> None:
    """`settle`, then ends the thread. `quietly`: for a run ending on another
    error, whose checkpoint write may have failed too (the previous
    checkpoint then stays the newest; the run's error says what failed)."""
    try:
      self.settle()
    except Exception:  # pylint: disable=broad-except
      if not quietly:
        raise
    finally:
      if self._pool is not None and self._pending is None and self._pruning is None:
        self._pool.shutdown()
        self._pool = None


def _write(staged: StagedCheckpoint, durable: concurrent.futures.Future) -> None:
  """On the writer's thread: commits `staged`, tells `durable`, then prunes."""
  try:
    durable.set_result(staged.commit())
  except BaseException as e:  # pylint: disable=broad-except
    durable.set_exception(e)  # raised by `wait`; nothing to prune
    return
  staged.prune()
