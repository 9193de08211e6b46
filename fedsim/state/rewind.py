"""Rewinds a run directory's logs to a checkpoint before the run resumes.

A run killed after its checkpoint of round R has logged rounds R+1.. that
will be run again. metrics.csv is cut by `CsvSink(resume_after_round=R)`;
this module cuts the rest, so that every reader sees each round once:

* TensorBoard event files of the run directory are rewritten without the
  events logged after the checkpoint was taken. The cut is by wall time,
  because the accuracy-by-bits and by-simulated-time tags step in bits and
  milliseconds, not rounds, and the HParams session of a completed run
  (extended with more rounds) is logged at step 0; the other tags also lose
  their steps after R. (Runs written before those tags existed logged them
  in `simulated_time/` and `by_bits/`: those are rewound too.)
  Rewriting beats TensorBoard's purge-on-restart (a SessionLog START event):
  other readers (EventAccumulator with purging off, tbparse, pandas) would
  still see the duplicates.
* `events.log` loses its lines about rounds after R.

A run killed before its first checkpoint has nothing to rewind to:
`rewind_to_start` clears its logs instead, and it runs again from round 0.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil

from fedsim.metric_names import EVAL_ACCURACY_BY_BITS, EVAL_ACCURACY_BY_SIMULATED_MS
from fedsim.state.checkpoint import Checkpoint

_EVENTS_PREFIX = "events.out.tfevents."
# The run's only tags whose steps are not rounds.
_OFF_ROUND_TAGS = frozenset({EVAL_ACCURACY_BY_BITS, EVAL_ACCURACY_BY_SIMULATED_MS})
# Where runs of earlier fedsim versions logged those two (as eval/accuracy).
_OLD_LOG_DIRS = ("simulated_time", "by_bits")
_ROUND_LINE = re.compile(r"round (\d+):")


def rewind_logs(run_dir: pathlib.Path, checkpoint: Checkpoint) -> None:
  """Drops everything `run_dir` logged after `checkpoint` (except metrics.csv).

  Raises:
    OSError: if a log file cannot be rewritten.
  """
  # Only the run loop's log directories: a recursive search would walk every
  # checkpoint's client-state links (thousands of files), which hold no events.
  for log_dir, max_step in ((run_dir, checkpoint.round_num),
                            *((run_dir / old, None) for old in _OLD_LOG_DIRS)):
    for path in sorted(log_dir.glob(_EVENTS_PREFIX + "*")):
      if path.is_file():
        rewrite_event_file(path, checkpoint.wall_time, max_step)
  _rewind_events_log(run_dir / "events.log", checkpoint.round_num)


def rewind_to_start(run_dir: pathlib.Path) -> None:
  """Removes what a run that stopped before its first checkpoint logged, so
  that it restarts from round 0 in the same directory.

  Its rounds will be run again from the initial state: metrics.csv,
  clients.csv, events.log, the TensorBoard event files (as `rewind_logs`
  walks them), its clients' states and any partial checkpoint go; config.yaml,
  status and worker.log stay. Call it only holding the directory's lock and
  after `latest_checkpoint` found no complete checkpoint.

  Raises:
    OSError: if a file cannot be removed.
  """
  for log_dir in (run_dir, *(run_dir / old for old in _OLD_LOG_DIRS)):
    for path in log_dir.glob(_EVENTS_PREFIX + "*"):
      path.unlink()
  # The run loop's file names (its callbacks import this module).
  for name in ("metrics.csv", "clients.csv", "events.log", "final_model.npz"):
    (run_dir / name).unlink(missing_ok=True)
  for name in ("client_states", "checkpoints"):
    if (run_dir / name).exists():
      shutil.rmtree(run_dir / name)


def rewrite_event_file(path: pathlib.Path, max_wall_time: float,
                       max_step: int | None = None) -> int:
  """Keeps the events of `path` logged by `max_wall_time` (and, but for the
  accuracy-by-bits and by-simulated-time tags, at step <= `max_step`).

  A torn last record (a kill mid-write) is dropped too. The file is replaced
  atomically; it is left untouched if nothing is dropped, and removed if
  nothing but its header is left: a completed run's HParams session, logged
  after its last checkpoint, is wholly cut, and the board, which keeps a
  session file named by what it holds, would take the empty shell for it
  when the resumed run completes with the same values.

  Returns:
    The number of events dropped.
  """
  from fedsim.reporting.sinks import load_tensorflow  # pylint: disable=g-import-not-at-top
  tf = load_tensorflow()
  kept, dropped, events_kept = [], 0, False  # events_kept: any but the file header
  # Not tf.compat.v1.train.summary_iterator: it logs a deprecation warning.
  records = iter(tf.data.TFRecordDataset(str(path)))
  while True:
    try:
      event = tf.compat.v1.Event.FromString(next(records).numpy())
    except StopIteration:
      break
    except tf.errors.DataLossError:  # Torn tail.
      dropped += 1
      break
    is_file_header = event.HasField("file_version")
    by_round = not any(value.tag in _OFF_ROUND_TAGS for value in event.summary.value)
    late = event.wall_time > max_wall_time or (
        max_step is not None and by_round and event.step > max_step)
    if late and not is_file_header:
      dropped += 1
    else:
      kept.append(event.SerializeToString())
      events_kept = events_kept or not is_file_header
  if dropped and not events_kept:
    path.unlink()
  elif dropped:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tf.io.TFRecordWriter(str(tmp)) as writer:
      for record in kept:
        writer.write(record)
    os.replace(tmp, path)
  return dropped


def _rewind_events_log(path: pathlib.Path, round_num: int) -> None:
  if not path.exists():
    return
  lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
  kept = [line for line in lines if not ((m := _ROUND_LINE.match(line))
                                         and int(m.group(1)) > round_num)]
  if kept != lines:
    from fedsim.reporting.rundir import write_text_atomic  # pylint: disable=g-import-not-at-top
    write_text_atomic(path, "".join(kept))
