"""fedsim's TFF worker lifecycle and quiet start-up, proven with real processes.

The slow tests run scripts from `scripts/` as subprocesses with their stdout
and stderr on pipes: a worker that kept a pipe open would show up as a
timeout, and every pid a script reports must be gone once it has ended.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from fedsim.backend import quiet

SCRIPTS = pathlib.Path(__file__).parent / "scripts"
REPO = pathlib.Path(__file__).parents[2]
PIPE_TIMEOUT_S = 90  # TF import alone takes 10-20 s on a busy 2-core machine.

# What TF 2.14 printed at import on this machine with TF_CPP_MIN_LOG_LEVEL=0.
IMPORT_LOG = """\
2026-11-21 12:50:21.331049: I tensorflow/core/util/port.cc:111] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
2026-11-21 12:50:21.333677: I tensorflow/tsl/cuda/cudart_stub.cc:28] Could not find cuda drivers on your machine, GPU will not be used.
2026-11-21 12:50:21.418607: E tensorflow/compiler/xla/stream_executor/cuda/cuda_dnn.cc:9342] Unable to register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered
2026-11-21 12:50:21.418690: E tensorflow/compiler/xla/stream_executor/cuda/cuda_fft.cc:609] Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT when one has already been registered
2026-11-21 12:50:21.418749: E tensorflow/compiler/xla/stream_executor/cuda/cuda_blas.cc:1518] Unable to register cuBLAS factory: Attempting to register factory for plugin cuBLAS when one has already been registered
2026-11-21 12:50:21.434958: I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
2026-11-21 12:50:25.906163: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning: Could not find TensorRT
"""
REAL_ERROR = "2026-11-21 12:50:26.000000: E tensorflow/core/x.cc:1] Out of memory\n"


def _env(**overrides: str | None) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env["PYTHONPATH"] = str(REPO)
  for key, value in overrides.items():
    if value is None:
      env.pop(key, None)
    else:
      env[key] = value
  return env


def _python(code: str, cwd) -> subprocess.CompletedProcess:
  """Runs `code` in a fresh interpreter with the test environment; must exit 0."""
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env=_env(), cwd=cwd, timeout=60, check=True)


def _gone(pid: int) -> bool:
  """True once `pid` has exited (a zombie holds no files, so it counts)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
  except FileNotFoundError:
    return True


def _wait_gone(pid: int, seconds: float = 5.0) -> bool:
  deadline = time.monotonic() + seconds
  while not _gone(pid):
    if time.monotonic() > deadline:
      return False
    time.sleep(0.05)
  return True


def _kill_if_worker(pid: int) -> None:
  """Cleanup for a failed test: kills `pid` only if it is still a TFF worker."""
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      if b"worker_binary" in f.read():
        os.kill(pid, signal.SIGKILL)
  except (FileNotFoundError, ProcessLookupError):
    pass


def _run(args: list[str], out_dir: pathlib.Path, env: dict[str, str],
         send: signal.Signals | None = None) -> tuple[subprocess.CompletedProcess, int]:
  """(result, pid) of a script run to its end; with `send`, signalled once pid.json exists."""
  proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, cwd=out_dir)
  try:
    if send is not None:
      deadline = time.monotonic() + PIPE_TIMEOUT_S
      while not (out_dir / "pid.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "script never reported its worker"
        time.sleep(0.05)
      os.kill(proc.pid, send)
    out, err = proc.communicate(timeout=PIPE_TIMEOUT_S)
    return (subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode()),
            proc.pid)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
    for name in ("pid.json", "report.json"):
      if (out_dir / name).exists():
        report = json.loads((out_dir / name).read_text())
        for key, pid in report.items():
          if key == "worker" or key.endswith("_pid"):
            _kill_if_worker(pid)


def test_known_noise_lines_are_recognised_and_real_ones_kept():
  lines = (IMPORT_LOG + REAL_ERROR).splitlines()
  assert [line for line in lines if not quiet.is_noise(line)] == [REAL_ERROR.rstrip("\n")]


def test_filtered_stderr_writes_back_real_lines_in_order(tmp_path):
  # fd 2 is a pipe here, not a terminal; entered twice in one process.
  code = f"""
import os, sys
from fedsim.backend.quiet import filtered_stderr
for _ in range(2):
  with filtered_stderr():
    os.write(2, {IMPORT_LOG.encode()!r})
    sys.stderr.write("python warning\\n")
    os.write(2, {REAL_ERROR.encode()!r})
    print("stdout untouched")
print("tensorflow" in sys.modules)
"""
  result = _python(code, tmp_path)
  assert result.stderr == 2 * ("python warning\n" + REAL_ERROR)
  assert result.stdout == "stdout untouched\nstdout untouched\nFalse\n"


def test_filtered_stderr_tolerates_closed_fd2(tmp_path):
  code = ("import os\nos.close(2)\nfrom fedsim.backend.quiet import filtered_stderr\n"
          "with filtered_stderr():\n  print('inside')\n")
  result = _python(code, tmp_path)
  assert result.stdout == "inside\n"


def test_runtime_package_and_quiet_do_not_import_tensorflow(tmp_path):
  code = ("import sys, fedsim.runtime, fedsim.backend.quiet\n"
          "print(sorted(m for m in ('tensorflow', 'tensorflow_federated') if m in sys.modules))")
  result = _python(code, tmp_path)
  assert result.stdout == "[]\n"


@pytest.mark.slow
def test_importing_fedsim_leaves_tffs_context_and_a_session_restores_it(tmp_path):
  code = f"""
import numpy as np
import tensorflow_federated as tff
stack = tff.framework.get_context_stack()
tffs = stack.current
import fedsim, fedsim.api, fedsim.cli, fedsim.experiment.loop
from fedsim.runtime import session, signals, worker_binary
from fedsim.backend import contexts
print(stack.current is tffs)

@tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
def total(values):
  return tff.federated_sum(values)

with session.session({str(tmp_path / "worker.log")!r}) as w:
  print(stack.current is tffs, total([1, 2]))
print(stack.current is tffs, session._guard)
"""
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(), cwd=tmp_path, timeout=PIPE_TIMEOUT_S, check=True)
  assert result.stdout == "True\nFalse 3\nTrue None\n"


# mode of end_session.py, signal sent while it waits, expected exit status.
END_MODES = {
    "normal": ("normal", None, 0),
    "exception": ("exception", None, 1),
    "sigterm": ("wait", signal.SIGTERM, 143),
    "sigkill": ("wait", signal.SIGKILL, -signal.SIGKILL),
    "keyboard_interrupt": ("wait", signal.SIGINT, -signal.SIGINT),
}


@pytest.mark.slow
@pytest.mark.parametrize("end", [
    # A clean end and Ctrl-C are what the run tests end with anyway, and an
    # exception or SIGTERM ends the parent through the same clean-up: `-m long`
    # only. SIGKILL leaves the worker to notice its parent is gone.
    pytest.param(end, marks=pytest.mark.long if end != "sigkill" else ())
    for end in END_MODES])
def test_worker_is_gone_after_parent_ends(end, tmp_path):
  mode, send, status = END_MODES[end]
  result, _ = _run([str(SCRIPTS / "end_session.py"), mode, str(tmp_path)], tmp_path,
                   _env(TMPDIR=str(tmp_path)), send=send)
  worker_pid = json.loads((tmp_path / "pid.json").read_text())["worker"]
  assert result.returncode == status, result.stderr
  assert _wait_gone(worker_pid), f"worker {worker_pid} outlived its parent ({end})"
  assert result.stdout == "sum 6\n" + ("done\n" if end == "normal" else "")
  if end == "normal":
    # Default log level: no TF start-up noise, nothing from gRPC or the worker.
    assert result.stderr == ""
  elif end == "exception":
    assert result.stderr.endswith("ValueError: planned failure\n")
  elif end == "keyboard_interrupt":
    assert result.stderr.endswith("KeyboardInterrupt\n")
  else:
    assert result.stderr == ""
  assert (tmp_path / "worker.log").read_text().startswith("--- fedsim: ")


@pytest.mark.slow
def test_guard_session_nesting_and_dead_worker(tmp_path):
  # Most verbose TF logging: every known noise line is printed at import.
  result, script_pid = _run([str(SCRIPTS / "guard.py"), str(tmp_path)], tmp_path,
                            _env(TMPDIR=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="0"))
  assert result.returncode == 0, result.stderr
  assert result.stdout == "report written\n"
  report = json.loads((tmp_path / "report.json").read_text())
  pids = [report[k] for k in ("guard_pid", "thread_worker_pid", "outer_pid", "inner_pid",
                              "replaced_guard_pid")]
  assert all(_wait_gone(pid) for pid in pids), pids
  assert len(set(pids)) == 5

  # Outside any session: a fedsim-owned worker, logging to a temp file, is
  # the script's only worker child, and none of its fds is the script's pipe.
  guard_log = tmp_path / f"fedsim-worker-{script_pid}.log"
  assert report["guard_before_call"] is True
  assert report["guard_result"] == 6
  assert report["guard_log"] == str(guard_log)
  assert report["children"] == {
      str(report["guard_pid"]): {"0": "/dev/null", "1": str(guard_log), "2": str(guard_log)}}
  assert report["own_stdout"].startswith("pipe:")
  assert "TFF ExecutorService started" in guard_log.read_text()
  assert "TFF ExecutorService started" not in result.stderr
  assert not any(map(quiet.is_noise, result.stderr.splitlines())), result.stderr
  assert report["same_tf"] is True

  assert report["thread_worker_alive"] is True  # Forked for a thread that ended.
  assert (report["outer_result"], report["inner_result"]) == (3, 9)
  outer = f"TFF worker process (pid {report['outer_pid']}) died during"
  assert report["dead_call"] == f"{outer} a TFF computation; see {tmp_path / 'outer.log'}"
  assert report["check_alive"] == f"{outer} round 7; see {tmp_path / 'outer.log'}"
  assert report["threads_added_by_sessions"] == 0
  assert report["after_sessions_result"] == 15
  assert report["guard_pid_after_sessions"] == report["guard_pid"]
  assert report["replaced_guard_result"] == 2
  assert report["start_failure"].endswith(
      f"exited with code 1 while starting; see {tmp_path / 'bad.log'}")
  assert report["owned_after_failure"] == 1  # Only the guard's worker.

