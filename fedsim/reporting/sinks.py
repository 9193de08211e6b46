"""Where per-round metrics go: metrics.csv, TensorBoard scalars, or both.

The run loop hands each sink one flat `{name: number}` dict per round.
fedsim writes its own CSV rather than using `tff.program.CSVFileReleaseManager`
because, in TFF 0.87, that manager sorts columns by name, keeps a torn last
line as a row, and needs a ~10 s TensorFlow import to append a line of text;
`tff.program.TensorBoardReleaseManager` is not used because its summary
writer is private and never flushed, so per-round flushing would need its
internals plus an event-loop adapter, and it runs a TensorFlow op per scalar
(see `TensorBoardSink`).
"""

from __future__ import annotations

import array
import csv
import errno
import io
import itertools
import numbers
import os
import pathlib
import socket
import struct
import time
from typing import Any, Iterable, Mapping, Protocol


from fedsim.errors import UserError
from fedsim.metric_names import ROUND
from fedsim.reporting.board_tags import board_tag
from fedsim.reporting.rundir import write_text_atomic


class MetricsSink(Protocol):
  """Receives one flat dict of metrics per round."""

  def write(self, round_num: int, metrics: Mapping[str, float]) -> None:
    ...

  def close(self) -> None:
    ...


def load_tensorflow() -> Any:
  """Returns the `tensorflow` module, imported quietly when fedsim can."""
  try:
    from fedsim.backend.quiet import import_tensorflow  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    # Tolerated only while fedsim.backend.quiet does not exist (yet).
    if e.name not in ("fedsim.backend", "fedsim.backend.quiet", None):
      raise
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf
  return import_tensorflow()


def os_error_from_tf(error: Exception, path: str | os.PathLike) -> OSError:
  """The OSError behind a TensorFlow file-writing error, naming `path`.

  TF's event writer reports a full disk as a ResourceExhaustedError with no
  message and no path.
  """
  if type(error).__name__ == "ResourceExhaustedError":
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
  return OSError(errno.EIO, getattr(error, "message", "") or type(error).__name__,
                 os.fspath(path))


def _read_table(path: pathlib.Path) -> tuple[list[str], list[list[str]], bool]:
  """(header, rows, torn) of a CSV file; a torn last line is left out.

  A line is complete only once its newline is written, so whatever follows
  the last newline is what a kill mid-write left behind.

  Raises:
    OSError: the file cannot be read.
    UserError: naming the file, if it is not UTF-8 text.
  """
  try:
    text = path.read_text(encoding="utf-8")
  except UnicodeDecodeError as e:  # e.g. saved again by a spreadsheet in another encoding
    raise UserError(f"{path}: a byte that is not UTF-8 at offset {e.start}") from None
  complete = text[:text.rfind("\n") + 1]
  rows = list(csv.reader(io.StringIO(complete, newline="")))
  if not rows:
    return [], [], bool(text)
  return rows[0], rows[1:], len(complete) != len(text)


def _format_lines(rows: Iterable[list[str]]) -> str:
  buffer = io.StringIO()
  csv.writer(buffer, lineterminator="\n").writerows(rows)
  return buffer.getvalue()


def _cell(value: Any) -> str:
  # repr(float) round-trips exactly; integers (counts, bits) stay integers.
  kind = type(value)
  if kind is float:  # most cells: no abstract-class checks
    return repr(value)
  if kind is int:
    return str(value)
  if isinstance(value, str):  # e.g. clients.csv's client ids
    return value
  if isinstance(value, numbers.Integral):
    return str(int(value))
  return repr(float(value))


def _parse_cell(text: str) -> float:
  try:
    return int(text)
  except ValueError:
    return float(text)


def _round_of(row: list[str], path: pathlib.Path) -> int:
  try:
    return int(row[0])
  except (ValueError, IndexError):
    raise UserError(f"{path}: bad '{ROUND}' cell {row[:1]!r}") from None


class CsvSink:
  """Writes `metrics.csv`: one row per round, column 'round' first.

  Columns follow the order in which metric names are first seen; a name that
  first appears later (eval metrics on eval rounds) adds a column, rewriting
  the file atomically with empty cells where it was absent. Each row is
  flushed as it is written, so a killed run keeps every completed round.
  """

  def __init__(self, path: str | os.PathLike, resume_after_round: int | None = None):
    """Opens `path`, keeping the rows already in it (if any).

    Args:
      path: the CSV file; created at the first `write` if missing.
      resume_after_round: if given, rows of later rounds are dropped (their
        rounds will be run again after a checkpoint restore).

    Raises:
      UserError: if an existing file is not a fedsim metrics file.
    """
    self._path = pathlib.Path(path)
    self._columns: list[str] = []
    self._known: frozenset[str] = frozenset()  # the columns, looked up per cell
    self._file = None
    if self._path.exists():
      header, rows, torn = _read_table(self._path)
      if not header:
        return
      if header[0] != ROUND:
        raise UserError(f"{self._path}: not a fedsim metrics file"
                        f" (first column is not '{ROUND}')")
      kept = rows
      if resume_after_round is not None:
        kept = [r for r in rows if _round_of(r, self._path) <= resume_after_round]
      if torn or len(kept) != len(rows):
        write_text_atomic(self._path, _format_lines([header, *kept]))
      self._columns, self._known = header, frozenset(header)
      self._file = open(self._path, "a", encoding="utf-8", newline="")

  @property
  def path(self) -> pathlib.Path:
    return self._path

  def write(self, round_num: int, metrics: Mapping[str, float]) -> None:
    """Appends the row of `round_num`.

    Raises:
      ValueError: if `metrics['round']` disagrees with `round_num`, or a value
        is neither a number nor a string.
      OSError: naming the file, if it cannot be written (e.g. a full disk).
    """
    if ROUND in metrics and metrics[ROUND] != round_num:
      raise ValueError(f"metrics['{ROUND}'] = {metrics[ROUND]} but round_num = {round_num}")
    row = {ROUND: _cell(round_num)}
    row.update((k, _cell(v)) for k, v in metrics.items() if k != ROUND)
    new = [k for k in row if k not in self._known]
    try:
      if self._file is None or new:
        self._rewrite(new, row)
      else:
        self._file.write(_format_lines([[row.get(c, "") for c in self._columns]]))
        self._file.flush()
    except OSError as e:
      if e.filename is not None:
        raise
      raise OSError(e.errno, e.strerror, str(self._path)) from None

  def _rewrite(self, new_columns: list[str], row: Mapping[str, str]) -> None:
    """Rewrites the whole file with the widened header, then `row`."""
    old = []
    if self._columns:
      _, old, _ = _read_table(self._path)
      self.close()
    self._columns = self._columns + new_columns
    self._known = frozenset(self._columns)
    width = len(self._columns)
    lines = [self._columns]
    lines += [r + [""] * (width - len(r)) for r in old]
    lines.append([row.get(c, "") for c in self._columns])
    write_text_atomic(self._path, _format_lines(lines))
    self._file = open(self._path, "a", encoding="utf-8", newline="")

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


def read_metrics_csv(path: str | os.PathLike, complete: bool = False) -> list[dict[str, float]]:
  """Returns the rows of a metrics.csv, one dict per round.

  Empty cells are absent keys; integer cells (round, counts) are ints. A torn
  last line (a run killed mid-write, or cut off by a full disk) is ignored,
  unless `complete`: the run completed, so its last row was written whole and
  a last line without its newline is damage.

  Raises:
    UserError: naming the file (and the line), if it is missing, unreadable
      or malformed: not UTF-8, a line without its round (an empty line), or,
      with `complete`, a last line cut off.
  """
  path = pathlib.Path(path)
  try:
    header, rows, torn = _read_table(path)
  except OSError as e:
    raise UserError(f"cannot read metrics file {path}: {e.strerror or e}") from None
  if header[:1] != [ROUND]:
    raise UserError(f"{path}: not a fedsim metrics file (first column is not '{ROUND}')")
  if torn and complete:
    raise UserError(f"{path}: its last line is cut off (no newline ends it), though the run"
                    " completed")
  out = []
  for line_num, row in enumerate(rows, start=2):
    if len(row) > len(header):
      raise UserError(f"{path}:{line_num}: {len(row)} cells but {len(header)} columns")
    if not row or row[0] == "":
      raise UserError(f"{path}:{line_num}: " + ("an empty line" if not any(row)
                                                 else f"no '{ROUND}' in this row"))
    try:
      out.append({k: _parse_cell(v) for k, v in zip(header, row) if v != ""})
    except ValueError:
      raise UserError(f"{path}:{line_num}: a cell is not a number") from None
  return out


class TensorBoardSink:
  """TensorBoard scalars, step = round, each under its metric's
  `board_tags.board_tag` (`eval/accuracy` stays, `aggregate_bits` is
  `sent/aggregate_bits`).

  The events are those `tf.summary.scalar` writes (one per metric: a float32
  scalar tensor with the scalars plugin's metadata), written as records of a
  new `events.out.tfevents.*` file by TensorFlow's record writer, without
  running TensorFlow ops: a summary op costs ~0.3 ms of eager dispatch, ~8 ms
  a round for W2's ~30 metrics, a third of its loop around the compiled
  round. Each event's bytes are joined from parts serialized once per tag
  (the bytes protobuf would give: see `_scalar_event_parts`), ~5x faster
  than setting and serializing the message each time.
  """

  def __init__(self, log_dir: str | os.PathLike):
    """Opens a new event file in `log_dir` (imports TensorFlow, ~10 s once).

    Raises:
      OSError: naming the file, if it cannot be created.
    """
    self._tf = load_tensorflow()
    from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
    log_dir = pathlib.Path(log_dir)
    # As TF's summary writer names its files; the counter keeps two sinks
    # opened by one process in one second apart, zero-padded because TensorBoard
    # reads a directory's files in name order (unpadded, sink 10 came before 9).
    self._path = log_dir / (f"events.out.tfevents.{int(time.time()):010d}."
                            f"{socket.gethostname()}.{os.getpid()}.{next(_EVENT_FILES):08d}.v2")
    self._events: dict[str, tuple[bytes, bytes]] = {}  # by metric: `_scalar_event_parts`
    try:
      log_dir.mkdir(parents=True, exist_ok=True)
      self._writer = self._tf.io.TFRecordWriter(os.fspath(self._path))
      self._writer.write(event_pb2.Event(wall_time=time.time(),
                                         file_version=_EVENT_FILE_VERSION).SerializeToString())
      self._writer.flush()
    except self._tf.errors.OpError as e:
      raise os_error_from_tf(e, self._path) from None

  @property
  def path(self) -> pathlib.Path:
    """The event file this sink writes."""
    return self._path

  def write(self, round_num: int, metrics: Mapping[str, float]) -> None:
    """Writes one scalar event per metric at step `round_num` and flushes
    (the file's readers, e.g. a live TensorBoard, see every round).

    Raises:
      OSError: naming the events file, if the events cannot be written.
    """
    names = [name for name in metrics if name != ROUND]  # the round is the step
    # float32 in native byte order, as tf.summary.scalar stores it (a value
    # too large for float32 becomes inf).
    values = array.array("f", [float(metrics[name]) for name in names]).tobytes()
    # Event fields 1 (wall_time, a double) and 2 (step, a varint; absent when 0, as
    # protobuf leaves a default out), then the summary.
    step = int(round_num)
    head = b"\x09" + struct.pack("<d", time.time()) + (
        b"\x10" + _varint(step) if step else b"")
    try:
      for i, name in enumerate(names):
        parts = self._events.get(name)
        if parts is None:
          parts = self._events[name] = _scalar_event_parts(board_tag(name))
        self._writer.write(head + parts[0] + values[4 * i:4 * i + 4] + parts[1])
      self._writer.flush()
    except self._tf.errors.OpError as e:
      raise os_error_from_tf(e, self._path) from None

  def close(self) -> None:
    """Flushes and closes the file. Raises OSError as `write`."""
    try:
      self._writer.close()
    except self._tf.errors.OpError as e:
      raise os_error_from_tf(e, self._path) from None


_EVENT_FILES = itertools.count()
_EVENT_FILE_VERSION = "brain.Event:2"


def _scalar_event(tag: str) -> Any:
  """An event of `tag` as `tf.summary.scalar` logs it; wall time, step and the
  value (a float32's 4 bytes) are set per write."""
  # pylint: disable=g-import-not-at-top
  from tensorboard.compat.proto import (event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2,
                                        types_pb2)
  from tensorboard.plugins.scalar import metadata as scalar_metadata
  return event_pb2.Event(summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(
      tag=tag,
      metadata=summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(
          plugin_name=scalar_metadata.PLUGIN_NAME)),
      tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT,
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto()))]))


def _scalar_event_parts(tag: str) -> tuple[bytes, bytes]:
  """The serialized event of `tag` after its step, cut where its value's 4 bytes go:
  field 5 (the summary) with its length, the summary up to the value, the rest."""
  marker = b"\xde\xad\xbe\xef"
  event = _scalar_event(tag)
  event.summary.value[0].tensor.tensor_content = marker
  summary = event.summary.SerializeToString()
  before, after = summary.split(marker)  # the tag is text: the marker is not valid UTF-8
  return b"\x2a" + _varint(len(summary)) + before, after


def _varint(value: int) -> bytes:
  """`value` as a protobuf varint (an int64's two's complement when negative)."""
  value &= 2**64 - 1
  out = bytearray()
  while value > 0x7f:
    out.append(value & 0x7f | 0x80)
    value >>= 7
  out.append(value)
  return bytes(out)


class CompositeSink:
  """Hands every round to each of several sinks, in order."""

  def __init__(self, sinks: Iterable[MetricsSink]):
    self._sinks = list(sinks)

  def write(self, round_num: int, metrics: Mapping[str, float]) -> None:
    for sink in self._sinks:
      sink.write(round_num, metrics)

  def close(self) -> None:
    """Closes every sink, even if one fails; then re-raises the first error."""
    error = None
    for sink in self._sinks:
      try:
        sink.close()
      except Exception as e:  # pylint: disable=broad-except
        error = error or e
    if error is not None:
      raise error

  def __enter__(self) -> CompositeSink:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
