"""The run loop's callback order: hooks go down the list and unwind up it; the
standard list evaluates before logging and checkpoints after; the user's
callbacks come last, may stop the run and are named when they fail."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

import fedsim
from fedsim.errors import RunFailed, UserError
from fedsim.experiment.callbacks import Callback, CallbackList, UserCallback, standard_callbacks
from fedsim.experiment.callbacks.experiment_board import ExperimentBoard
from fedsim.experiment.callbacks.checkpoints import Checkpoints
from fedsim.experiment.callbacks.csv_logs import CsvLogs
from fedsim.experiment.callbacks.evaluation import Evaluation
from fedsim.experiment.callbacks.final_model import FinalModel
from fedsim.experiment.callbacks.on_round import OnRound
from fedsim.experiment.callbacks.status_file import Status
from fedsim.experiment.callbacks.tensorboard import TensorBoard


class _Recorder(Callback):

  def __init__(self, name, calls, replacement=None):
    self._name, self.calls, self.replacement = name, calls, replacement

  @property
  def name(self):
    return self._name

  def on_start(self, run):
    self.calls.append(("start", self.name))

  def after_round(self, run, record):
    self.calls.append(("round", self.name))
    return self.name.startswith("stop")

  def on_end(self, run):
    self.calls.append(("end", self.name))

  def on_error(self, run, error):
    self.calls.append(("error", self.name, error))
    return self.replacement


def _run(round_num=3):
  return types.SimpleNamespace(round_num=round_num, stopped_by=None)


def test_hooks_go_down_the_list_and_unwind_up_it():
  calls, run = [], _run()
  callbacks = CallbackList([_Recorder("a", calls), _Recorder("b", calls)])
  callbacks.on_start(run)
  assert callbacks.after_round(run, None) is False and run.stopped_by is None
  callbacks.on_end(run)
  assert calls == [("start", "a"), ("start", "b"), ("round", "a"), ("round", "b"),
                   ("end", "b"), ("end", "a")]


def test_a_stop_lets_every_callback_see_the_round_and_names_the_first_that_asked():
  calls, run = [], _run()
  callbacks = CallbackList([_Recorder("a", calls), _Recorder("stop1", calls),
                            _Recorder("stop2", calls), _Recorder("b", calls)])
  assert callbacks.after_round(run, None) is True
  assert calls == [("round", "a"), ("round", "stop1"), ("round", "stop2"), ("round", "b")]
  assert run.stopped_by == "stop1"


class _Failing(Callback):

  def __init__(self, error=None, returns=None):
    self.error, self.returns = error, returns

  def on_start(self, run):
    if self.error is not None:
      raise self.error

  def after_round(self, run, record):
    if self.error is not None:
      raise self.error
    return self.returns

  def on_error(self, run, error):
    raise RuntimeError("cannot clean up\nsecond line")


def test_a_user_callback_that_raises_is_named_in_one_line():
  error = KeyError("x")
  with pytest.raises(RunFailed) as raised:
    UserCallback(_Failing(error)).after_round(_run(3), None)
  assert str(raised.value) == "round 3: callback _Failing.after_round raised KeyError: 'x'"
  assert raised.value.__cause__ is error
  with pytest.raises(RunFailed, match=r"^start-up: callback on_round\.on_start raised"
                                      r" ValueError: bad$"):
    UserCallback(_Failing(ValueError("bad\nmore")), name="on_round").on_start(_run())


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), SystemExit(143)])
def test_an_interrupt_in_a_user_callback_stays_an_interrupt(stop):
  with pytest.raises(type(stop)):
    UserCallback(_Failing(stop)).after_round(_run(), None)


def test_a_user_callback_returns_a_stop_flag_or_nothing():
  assert UserCallback(_Failing(returns=None)).after_round(_run(), None) is False
  assert UserCallback(_Failing(returns=True)).after_round(_run(), None) is True
  with pytest.raises(RunFailed, match=r"^round 2: callback _Failing.after_round returned"
                                      r" \{'loss': 1\}; return True to stop"):
    UserCallback(_Failing(returns={"loss": 1})).after_round(_run(2), None)


def test_a_user_on_error_that_raises_is_a_warning_not_the_error(capsys):
  assert UserCallback(_Failing()).on_error(_run(), ValueError("the run's")) is None
  assert capsys.readouterr().err == ("fedsim: warning: callback _Failing.on_error raised"
                                     " RuntimeError: cannot clean up\n")


def test_user_callbacks_come_after_checkpoints_and_on_round_before_the_final_model():
  mine, other = _Failing(), _Failing()
  listed = standard_callbacks(on_round=lambda *args: None, user=[mine, other]).callbacks
  kinds = [type(c) for c in listed]
  assert kinds.index(Checkpoints) < kinds.index(UserCallback)
  users = [c for c in listed if isinstance(c, UserCallback)]
  assert [c.name for c in users] == ["on_round", "_Failing", "_Failing"]
  assert [c._callback for c in users[1:]] == [mine, other]
  assert kinds[-1] is FinalModel


def test_fedsim_callback_is_the_built_ins_base_and_imports_no_tensorflow():
  assert fedsim.Callback is Callback
  code = ("import sys, fedsim; fedsim.Callback;"
          " print(sorted({'tensorflow', 'numpy'} & set(sys.modules)))")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert done.stdout == "[]\n"


def test_a_callback_that_is_not_a_fedsim_callback_is_refused_before_anything_runs(tmp_path):
  config = {"name": "c", "rounds": 1, "clients_per_round": 1, "model": {"name": "logistic"},
            "data": {"name": "digits", "num_clients": 2}}

  class Duck:
    def after_round(self, run, record):
      pass

  with pytest.raises(UserError, match=r"^callbacks\[1\]: expected a fedsim.Callback"
                                      r" \(subclass it\), got Duck$"):
    fedsim.run(config, logdir=tmp_path, callbacks=[_Failing(), Duck()])
  assert not list(tmp_path.iterdir())


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
  on_round = [c for c in standard_callbacks(on_round=lambda *args: None).callbacks
              if isinstance(c, UserCallback)]
  assert [type(c._callback) for c in on_round] == [OnRound]
  assert not [c for c in standard_callbacks().callbacks if isinstance(c, UserCallback)]
