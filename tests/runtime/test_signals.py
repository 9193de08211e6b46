"""fedsim's exit handlers on a process whose shutdown never finishes.

The script swallows KeyboardInterrupt forever, standing in for a call on the
exit path that blocks (once: 30 minutes in gRPC's Channel.close). It imports
no TensorFlow, so these tests take seconds.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from fedsim.runtime import signals

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "stuck_exit.py"
REPO = pathlib.Path(__file__).parents[2]
# What the tests that wait for the deadline set it to: the mechanism, not the 8 s.
SHORT_DEADLINE_S = 2.0
# What coverage.py's `patch = subprocess` (pyproject.toml) sets for a child to trace itself.
_COVERAGE_VARS = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")


def _untraced_env(**extra: str) -> dict[str, str]:
  """The child's environment without coverage's tracing: under a tracer (a
  debugger, coverage) fedsim raises an interrupt at once by design
  (`signals._raise_outside_tensorflow`), and these tests check where an
  untraced run, as users start it, raises it."""
  env = {k: v for k, v in os.environ.items() if k not in _COVERAGE_VARS}
  return dict(env, PYTHONPATH=str(REPO), **extra)


def _start(tmp_path, *args: str) -> subprocess.Popen:
  proc = subprocess.Popen(
      [sys.executable, str(SCRIPT), str(tmp_path), *args], stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
      # As a terminal would: a background job's SIGINT starts ignored.
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  assert proc.stdout.readline() == "ready\n"
  return proc


def _interrupt(proc: subprocess.Popen) -> None:
  proc.send_signal(signal.SIGINT)
  assert proc.stdout.readline() == "interrupt\n"


def test_second_ctrl_c_exits_at_once(tmp_path):
  proc = _start(tmp_path)
  try:
    _interrupt(proc)
    time.sleep(signals.SAME_INTERRUPT_S + 0.1)  # a second Ctrl-C, not the first's copy
    proc.send_signal(signal.SIGINT)
    # Well before the deadline: only the second Ctrl-C can have ended it.
    out, err = proc.communicate(timeout=signals.EXIT_DEADLINE_S / 2)
  finally:
    proc.kill()
  assert proc.returncode == 130
  assert err == "fedsim: interrupted again; exiting now\n"
  assert (tmp_path / "hook").exists()


def test_one_ctrl_c_delivered_twice_is_one_interrupt(tmp_path):
  """`uv run` in a terminal: the terminal signals the group, uv forwards its copy
  milliseconds later. The copy neither exits at once nor raises again: the
  swallowed interrupt runs into the deadline, and the forced exit still says
  how to resume."""
  proc = _start(tmp_path, "resume with: fedsim run --resume runs/x", str(SHORT_DEADLINE_S))
  try:
    proc.send_signal(signal.SIGINT)
    time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=SHORT_DEADLINE_S + 10)
  finally:
    proc.kill()
  assert proc.returncode == 130
  assert out.count("interrupt\n") == 1  # one KeyboardInterrupt
  assert err == (f"fedsim: still shutting down after {SHORT_DEADLINE_S:.0f} s;"
                 " exiting now; resume with: fedsim run --resume runs/x\n")


def test_a_copy_handled_late_by_the_main_thread_is_still_the_same_interrupt():
  """uv's copy arrives milliseconds after the first SIGINT, but Python runs its
  handler only when the main thread leaves the C call it is in (a Ray study
  waiting for its cancelled tasks: seconds). Judged by when the handler ran,
  it was a second Ctrl-C, and a Ray study exited 'interrupted again' (CI)."""
  script = pathlib.Path(__file__).parent / "scripts" / "late_second_handler.py"
  proc = subprocess.Popen(
      [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  try:
    for line in ("ready", "interrupt", "in C"):
      if line == "interrupt":
        proc.send_signal(signal.SIGINT)
      assert proc.stdout.readline() == line + "\n", proc.communicate(timeout=10)
    proc.send_signal(signal.SIGINT)  # within SAME_INTERRUPT_S of the first
    out, err = proc.communicate(timeout=signals.EXIT_DEADLINE_S / 2)
  finally:
    proc.kill()
  assert (proc.returncode, out, err) == (0, "done\n", "")


def test_a_blocked_shutdown_ends_at_the_deadline(tmp_path):
  proc = _start(tmp_path, "", str(SHORT_DEADLINE_S))
  try:
    _interrupt(proc)
    started = time.monotonic()
    out, err = proc.communicate(timeout=SHORT_DEADLINE_S + 10)
  finally:
    proc.kill()
  assert time.monotonic() - started >= SHORT_DEADLINE_S - 0.1  # not earlier
  assert proc.returncode == 130
  assert err == (f"fedsim: still shutting down after {SHORT_DEADLINE_S:.0f} s;"
                 " exiting now\n")
  assert (tmp_path / "hook").exists()


def test_sigterm_is_a_normal_exit_then_the_deadline(tmp_path):
  proc = _start(tmp_path)
  try:
    proc.send_signal(signal.SIGTERM)  # SystemExit(143) is not swallowed by the script.
    out, err = proc.communicate(timeout=signals.EXIT_DEADLINE_S / 2)
  finally:
    proc.kill()
  assert proc.returncode == 143 and err == ""
  assert not (tmp_path / "hook").exists()


@pytest.mark.slow  # imports TensorFlow in the child
def test_a_signal_inside_a_tensorflow_callback_still_interrupts(tmp_path):
  """The Ctrl-C-under-load traceback of issue 27: a KeyboardInterrupt raised
  while TF's C code had called back into Python became TF's TypeError ('Was
  eager Context initialized?') and failed the run; it now waits for TF to return."""
  script = pathlib.Path(__file__).parent / "scripts" / "signal_in_tensorflow.py"
  done = subprocess.run(
      [sys.executable, str(script), str(tmp_path), "INT", "TERM"], capture_output=True,
      text=True, timeout=300, env=_untraced_env(TF_CPP_MIN_LOG_LEVEL="2"),
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines() == ["KeyboardInterrupt", "SystemExit 143"], done.stderr


@pytest.mark.parametrize("kind", ["gc", "del", "finalize"])
def test_a_signal_inside_an_ignoring_callback_still_interrupts(kind):
  """A Ctrl-C handled inside a callback whose exceptions Python reports as
  'Exception ignored in ...' and drops was lost: inside a garbage-collector
  callback (JAX registers one) the run only ended at the deadline; inside
  asyncio's event loop's `__del__` (as TFF drops its loops) a study
  interrupted mid-run went on and exited 0. It is now raised in the frame
  that triggered the callback; so is one in a `weakref.finalize` callback."""
  script = pathlib.Path(__file__).parent / "scripts" / "signal_in_callback.py"
  done = subprocess.run([sys.executable, str(script), kind], capture_output=True, text=True,
                        timeout=60, env=_untraced_env(),
                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  assert done.returncode == 0, done.stderr
  assert done.stdout == "KeyboardInterrupt\n", done.stderr
  assert "Exception ignored" not in done.stderr


def test_a_signal_during_an_import_waits_for_the_module_to_be_whole(tmp_path):
  """A Ctrl-C handled while matplotlib's `ft2font` extension initialized (a
  run drawing its board as a study was interrupted) cut the import short:
  'ImportError: initialization failed', a traceback, and an interpreter that
  aborted as it shut down (CI, once). The interrupt is now raised in the frame
  that made the import, after the module is imported whole."""
  script = pathlib.Path(__file__).parent / "scripts" / "signal_in_import.py"
  done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                        text=True, timeout=60, env=_untraced_env(),
                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  assert done.returncode == 0, done.stderr
  assert done.stdout == "KeyboardInterrupt whole\n", done.stderr


def test_fedsim_run_installs_its_handlers_before_anything_slow():
  """`python -m fedsim.cli` imports the `fedsim` package before `main` can
  install the handlers: a Ctrl-C in the ~0.5-2 s it took to import the API
  (pydantic's schema, NumPy) gave a KeyboardInterrupt traceback, a SIGTERM exit -15."""
  probe = ("import sys, fedsim.cli\n"
           "print(sorted(m.split('.')[0] if not m.startswith('fedsim') else m for m in sys.modules\n"
           "             if m.startswith(('numpy', 'pydantic', 'yaml', 'fedsim.api',\n"
           "                              'fedsim.experiment', 'tensorflow'))))\n")
  done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
  assert done.stdout == "[]\n", done.stderr


def test_after_a_signal_tff_finalizers_failing_on_the_killed_worker_are_quiet(tmp_path):
  """TFF's remote values dispose of themselves on the worker in weakref
  finalizers; freed while the stack unwinds from a signal, after fedsim killed
  the worker, they printed 'Exception ignored in: <finalize object>' and a gRPC
  traceback (bench/signal_trials.py). Other code's unraisable errors still show."""
  fake_tff = tmp_path / "tensorflow_federated"
  fake_tff.mkdir()
  (fake_tff / "remote_executor.py").write_text(
      "def dispose():\n  raise ConnectionResetError('recvmsg:Connection reset by peer')\n")
  script = (
      "import importlib.util, os, signal, sys, time, weakref\n"
      "from fedsim.runtime import signals\n"
      "spec = importlib.util.spec_from_file_location('remote_executor', sys.argv[1])\n"
      "tff = importlib.util.module_from_spec(spec); spec.loader.exec_module(tff)\n"
      "def ours(): raise ValueError('not TFF')\n"
      "class Value: pass\n"
      "signals.install_exit_handlers()\n"
      "try:\n"
      "  os.kill(os.getpid(), signal.SIGTERM)\n"
      "  time.sleep(5)\n"
      "except SystemExit:\n"
      "  for fn in (tff.dispose, ours):\n"
      "    value = Value(); weakref.finalize(value, fn); del value\n"
      "print('done')\n")
  done = subprocess.run([sys.executable, "-c", script, str(fake_tff / "remote_executor.py")],
                        capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, PYTHONPATH=str(REPO)))
  assert done.stdout == "done\n", done.stderr
  assert "ValueError: not TFF" in done.stderr
  assert "Connection reset" not in done.stderr and done.stderr.count("Exception ignored") == 1


@pytest.mark.parametrize("when, code", [("return", 130), ("atexit", 0)])
def test_a_ctrl_c_once_the_work_is_done_ends_quietly(when, code):
  """A study interrupted as it finished: the Ctrl-C handled after `main()`
  returned escaped as a KeyboardInterrupt traceback (exit -2), and one handled
  during the exit aborted the process ('Fatal Python error', exit -6) once in a
  full test run. Raised as main() returns, it is the interrupt (130); during
  the exit, nothing is left to stop and the exit code stays the work's."""
  done = subprocess.run([sys.executable, str(SCRIPT.parent / "late_interrupt.py"), when],
                        capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, PYTHONPATH=str(REPO)),
                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  assert (done.returncode, done.stdout, done.stderr) == (code, "", "")


def test_the_program_marks_its_work_done_with_mains_code_and_the_exit_keeps_it(monkeypatch):
  """In this process (the test above runs it as a program): `program()` hands
  main()'s code to `work_done`, and the last atexit callback leaves with it."""
  from fedsim import cli
  monkeypatch.setattr(signals, "_work_done", False)
  monkeypatch.setattr(signals, "_exit_code", 0)
  monkeypatch.setattr(cli, "main", lambda: 2)
  monkeypatch.setattr(sys, "argv", ["fedsim", "validate", "c.yaml"])
  with pytest.raises(SystemExit) as raised:
    cli.program()
  assert raised.value.code == 2 and signals._work_done

  left = []
  monkeypatch.setattr(os, "_exit", left.append)
  signals._leave_after_exit_callbacks()
  assert left == [2]
  monkeypatch.setattr(signals, "_work_done", False)  # a process whose work was not done:
  signals._leave_after_exit_callbacks()              # Python's own exit goes on
  assert left == [2]

  def exits(argv=None):  # e.g. a plugin's sys.exit(3): its code, as Python exits
    raise SystemExit(3)
  monkeypatch.setattr(cli, "main", exits)
  with pytest.raises(SystemExit) as raised:
    cli.program()
  assert raised.value.code == 3 and not signals._work_done
