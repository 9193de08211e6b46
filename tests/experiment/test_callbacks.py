"""The run loop's callback order: hooks go down the list and unwind up it; the
standard list evaluates before logging and checkpoints after."""

from __future__ import annotations

from fedsim.experiment.callbacks import Callback, CallbackList, standard_callbacks
from fedsim.experiment.callbacks.board import ExperimentBoard
from fedsim.experiment.callbacks.checkpoints import Checkpoints
from fedsim.experiment.callbacks.csv_logs import CsvLogs
from fedsim.experiment.callbacks.evaluation import Evaluation
from fedsim.experiment.callbacks.on_round import OnRound
from fedsim.experiment.callbacks.status import Status
from fedsim.experiment.callbacks.tensorboard import TensorBoard


class _Recorder(Callback):

  def __init__(self, name, calls, replacement=None):
    self.name, self.calls, self.replacement = name, calls, replacement

  def on_start(self, run):
    self.calls.append(("start", self.name))

  def after_round(self, run, record):
    self.calls.append(("round", self.name))

  def on_end(self, run):
    self.calls.append(("end", self.name))

  def on_error(self, run, error):
    self.calls.append(("error", self.name, error))
    return self.replacement


def test_hooks_go_down_the_list_and_unwind_up_it():
  calls = []
  callbacks = CallbackList([_Recorder("a", calls), _Recorder("b", calls)])
  callbacks.on_start(None)
  callbacks.after_round(None, None)
  callbacks.on_end(None)
  assert calls == [("start", "a"), ("start", "b"), ("round", "a"), ("round", "b"),
                   ("end", "b"), ("end", "a")]


def test_every_callback_hears_the_error_and_a_replacement_is_raised():
  calls, error, meaning = [], ValueError("x"), RuntimeError("worker died")
  callbacks = CallbackList([_Recorder("status", calls, replacement=meaning),
                            _Recorder("sink", calls)])
  assert callbacks.on_error(None, error) is meaning
  assert calls == [("error", "sink", error), ("error", "status", error)]
  assert CallbackList([_Recorder("sink", [])]).on_error(None, error) is error


def test_status_first_evaluation_before_the_logs_checkpoints_after_them():
  kinds = [type(c) for c in standard_callbacks(on_round=lambda *args: None).callbacks]
  assert kinds[:2] == [ExperimentBoard, Status]  # the board's on_end after 'completed'
  position = kinds.index
  assert position(Evaluation) < position(CsvLogs) < position(Checkpoints)
  assert position(Evaluation) < position(TensorBoard) < position(Checkpoints)
  assert position(Checkpoints) < position(OnRound)
  assert OnRound not in [type(c) for c in standard_callbacks().callbacks]
