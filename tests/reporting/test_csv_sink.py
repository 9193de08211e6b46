from __future__ import annotations

import math

import pytest

from fedsim.errors import UserError
from fedsim.reporting.sinks import CompositeSink, CsvSink, read_metrics_csv

ROUND_1 = {"round": 1, "train/loss": 2.25, "train/accuracy": 0.125, "broadcast_bits": 6374720}
ROUND_2 = {"round": 2, "train/loss": 1.5, "train/accuracy": 0.5, "broadcast_bits": 6374720,
           "eval/loss": 1.75, "eval/accuracy": 0.375}
ROUND_3 = {"round": 3, "train/loss": 0.1, "train/accuracy": 0.9, "broadcast_bits": 6374720}


def _write(path, rows, **kwargs):
  sink = CsvSink(path, **kwargs)
  for row in rows:
    sink.write(row["round"], row)
  sink.close()


def test_rows_round_trip_with_column_union(tmp_path):
  path = tmp_path / "metrics.csv"
  _write(path, [ROUND_1, ROUND_2, ROUND_3])
  assert path.read_text().splitlines() == [
      "round,train/loss,train/accuracy,broadcast_bits,eval/loss,eval/accuracy",
      "1,2.25,0.125,6374720,,",
      "2,1.5,0.5,6374720,1.75,0.375",
      "3,0.1,0.9,6374720,,",
  ]
  assert read_metrics_csv(path) == [ROUND_1, ROUND_2, ROUND_3]


def test_values_round_trip_exactly(tmp_path):
  path = tmp_path / "metrics.csv"
  row = {"round": 1, "a": 0.1 + 0.2, "b": 1e-300, "c": float("nan"), "d": 2**53 + 1}
  _write(path, [row])
  back = read_metrics_csv(path)[0]
  assert back["a"] == 0.1 + 0.2 and back["b"] == 1e-300 and back["d"] == 2**53 + 1
  assert math.isnan(back["c"])
  assert isinstance(back["round"], int)


def test_round_key_is_optional_in_metrics(tmp_path):
  path = tmp_path / "metrics.csv"
  sink = CsvSink(path)
  sink.write(4, {"train/loss": 1.0})
  sink.close()
  assert read_metrics_csv(path) == [{"round": 4, "train/loss": 1.0}]


def test_mismatched_round_rejected(tmp_path):
  sink = CsvSink(tmp_path / "metrics.csv")
  with pytest.raises(ValueError):
    sink.write(2, {"round": 3, "train/loss": 1.0})
  sink.close()


def test_each_row_is_on_disk_before_close(tmp_path):
  path = tmp_path / "metrics.csv"
  sink = CsvSink(path)
  sink.write(1, ROUND_1)
  sink.write(3, ROUND_3)
  # Another reader sees both rows while the sink is still open.
  assert read_metrics_csv(path) == [ROUND_1, ROUND_3]
  sink.close()


def test_reopen_appends(tmp_path):
  path = tmp_path / "metrics.csv"
  _write(path, [ROUND_1, ROUND_2])
  _write(path, [ROUND_3])
  assert read_metrics_csv(path) == [ROUND_1, ROUND_2, ROUND_3]
  assert path.read_text().splitlines()[0] == (
      "round,train/loss,train/accuracy,broadcast_bits,eval/loss,eval/accuracy")


def test_resume_drops_later_rounds(tmp_path):
  path = tmp_path / "metrics.csv"
  _write(path, [ROUND_1, ROUND_2, ROUND_3])
  redo = dict(ROUND_2, **{"train/loss": 9.0})
  _write(path, [redo], resume_after_round=1)
  assert read_metrics_csv(path) == [ROUND_1, redo]


def test_resume_from_zero_keeps_header_only(tmp_path):
  path = tmp_path / "metrics.csv"
  _write(path, [ROUND_1, ROUND_2])
  CsvSink(path, resume_after_round=0).close()
  assert read_metrics_csv(path) == []
  assert path.read_text().count("\n") == 1


@pytest.mark.parametrize("resume", [None, 1])
def test_torn_last_line_is_dropped(tmp_path, resume):
  path = tmp_path / "metrics.csv"
  _write(path, [ROUND_1, ROUND_2])
  with open(path, "a") as f:
    f.write("3,0.1,0.")  # A kill in the middle of writing round 3.
  assert read_metrics_csv(path) == [ROUND_1, ROUND_2]
  _write(path, [ROUND_3], resume_after_round=resume)
  expected = [ROUND_1, ROUND_2, ROUND_3] if resume is None else [ROUND_1, ROUND_3]
  assert read_metrics_csv(path) == expected


def test_new_column_after_reopen(tmp_path):
  path = tmp_path / "metrics.csv"
  _write(path, [ROUND_1])
  _write(path, [ROUND_2])
  assert path.read_text().splitlines()[1] == "1,2.25,0.125,6374720,,"
  assert read_metrics_csv(path) == [ROUND_1, ROUND_2]


def test_no_file_until_first_row(tmp_path):
  CsvSink(tmp_path / "metrics.csv").close()
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text, match", [
    ("step,loss\n1,2\n", "not a fedsim metrics file"),
    ("round,loss\n1,abc\n", r"metrics.csv:2: a cell is not a number"),
    ("round,loss\n1,2,3\n", r"metrics.csv:2: 3 cells but 2 columns"),
])
def test_malformed_files_are_user_errors(tmp_path, text, match):
  path = tmp_path / "metrics.csv"
  path.write_text(text)
  with pytest.raises(UserError, match=match):
    read_metrics_csv(path)


def test_foreign_file_not_overwritten(tmp_path):
  path = tmp_path / "metrics.csv"
  path.write_text("step,loss\n1,2\n")
  with pytest.raises(UserError, match="not a fedsim metrics file"):
    CsvSink(path)
  assert path.read_text() == "step,loss\n1,2\n"


def test_missing_file_is_user_error(tmp_path):
  with pytest.raises(UserError, match="cannot read metrics file"):
    read_metrics_csv(tmp_path / "nope.csv")


class _Recorder:

  def __init__(self, log, name, fail_close=False):
    self.log, self.name, self.fail_close = log, name, fail_close

  def write(self, round_num, metrics):
    self.log.append((self.name, round_num, dict(metrics)))

  def close(self):
    self.log.append((self.name, "close"))
    if self.fail_close:
      raise OSError(self.name)


def test_composite_fans_out_and_closes_all():
  log = []
  sink = CompositeSink([_Recorder(log, "a", fail_close=True), _Recorder(log, "b")])
  sink.write(1, {"x": 1.0})
  with pytest.raises(OSError, match="a"):
    sink.close()
  assert log == [("a", 1, {"x": 1.0}), ("b", 1, {"x": 1.0}), ("a", "close"), ("b", "close")]
