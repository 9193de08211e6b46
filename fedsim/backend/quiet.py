"""Imports TensorFlow and TFF without their start-up noise on the terminal.

Importing TensorFlow 2.14 prints a screen of C++ log lines (cuDNN/cuFFT/cuBLAS
factory registration, missing CUDA drivers or TensorRT, CPU instruction hints)
straight to file descriptor 2, bypassing Python's `sys.stderr`. None of them
is actionable for a CPU simulation, and they bury real messages. This module:

* sets TF_CPP_MIN_LOG_LEVEL=2 unless the user chose a level (hides C++ INFO and
  WARNING lines for the whole process, the TFF worker included);
* caps TensorFlow's and absl's Python loggers at WARNING unless the user set a
  level on them;
* points fd 2 at a temporary file for the duration of the import, then writes
  back every line that is not known noise, so real warnings and errors (and a
  failing import's traceback) still reach the user.

Only the first import is filtered; later calls return the loaded module.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
import weakref
from types import ModuleType
from typing import Iterable, Iterator

from fedsim.backend import lazy_imports

# Lines TensorFlow prints at import on machines without a GPU (measured with
# TF 2.14.1 / TFF 0.87). Matched anywhere in the line because the C++ logger
# prefixes a timestamp and source location.
NOISE_PATTERNS = tuple(
    re.compile(pattern)
    for pattern in (
        r"Unable to register cu(DNN|FFT|BLAS) factory",
        r"TF-TRT Warning: Could not find TensorRT",
        r"This TensorFlow binary is optimized to use available CPU instructions",
        # Second line of the CPU instruction hint above.
        r"To enable the following instructions: .* rebuild TensorFlow",
        r"Could not find cuda drivers on your machine",
        r"oneDNN custom operations are on",
        # Grappler, while TFF compiles computations; harmless, logged as an error.
        r"grappler_item_builder\.cc:\d+\] Failed to detect the fetch node",
    )
)

_import_lock = threading.Lock()


def is_noise(line: str) -> bool:
  """True if `line` is one of TensorFlow's known start-up messages."""
  return any(pattern.search(line) for pattern in NOISE_PATTERNS)


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
  """Holds back output on fd 2 and replays it without the known noise lines.

  Everything written to file descriptor 2 inside the block, by Python or by
  C++, goes to a temporary file; on exit (normal or by exception) the lines
  for which `is_noise` is false are written to the original fd 2, in order.
  If fd 2 is closed the block runs unfiltered.
  """
  try:
    saved_fd = os.dup(2)
  except OSError:
    yield
    return
  _flush_stderr()
  with tempfile.TemporaryFile() as held:
    os.dup2(held.fileno(), 2)
    try:
      yield
    finally:
      _flush_stderr()
      os.dup2(saved_fd, 2)
      os.close(saved_fd)
      held.seek(0)
      kept = [line for line in held if not is_noise(line.decode(errors="replace"))]
      if kept:
        _write_all(2, b"".join(kept))


# callee -> how it was called already (and so compiled), for `filtered_first_call`.
_called: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def filtered_first_call(calls: Iterable[tuple[object, str]]) -> Iterator[None]:
  """`filtered_stderr` around the first call of each (callee, how), a no-op after.

  A compiled round logs its noise (Grappler's) when it compiles, at its first
  call (`how` says which of its functions a call compiles, e.g. the whole
  round or its phases); filtering costs 0.15-0.25 ms a call (a temporary
  file, dup2s, reading it back), most of the run loop's own time in a W2
  round, so later calls run unfiltered. A call counts once it returned.
  """
  new = [(callee, how) for callee, how in calls if how not in _ways_called(callee)]
  if not new:
    yield
    return
  with filtered_stderr():
    yield
  for callee, how in new:
    try:
      _called.setdefault(callee, set()).add(how)
    except TypeError:
      pass  # not weakly referable: filtered at every call, as before


def _ways_called(callee: object) -> set[str]:
  try:
    return _called.get(callee, set())
  except TypeError:  # not weakly referable
    return set()


def import_quietly(module_name: str) -> ModuleType:
  """Imports `module_name` as described in the module docstring; returns it.

  Safe to call repeatedly and from several threads: once the module is in
  `sys.modules` it is returned without touching fd 2.
  """
  loaded = sys.modules.get(module_name)
  if loaded is not None:
    return loaded
  with _import_lock:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # googleapis (under TFF) imports pkg_resources, whose setuptools warns on
    # import; not actionable for a fedsim user.
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated",
                            category=UserWarning)
    with filtered_stderr():
      module = importlib.import_module(module_name)
    _cap_python_loggers()
  return module


def import_tensorflow() -> ModuleType:
  """The `tensorflow` module, imported quietly; the packages it and TFF import
  but fedsim rarely uses run at their first use (`fedsim.backend.lazy_imports`)."""
  lazy_imports.defer()
  return import_quietly("tensorflow")


def import_tff() -> ModuleType:
  """The `tensorflow_federated` module, imported quietly (TensorFlow first).

  TFF's differential-privacy packages and JAX run at their first use, not
  with TFF (`fedsim.backend.lazy_imports`: 0.7 s of a 2.4 s import). The first import runs
  without Python's cyclic garbage collector, then freezes what exists (see
  `_without_cyclic_gc`). At exit, TFF's own default context is dropped while
  modules are intact (see `fedsim.backend.contexts.drop_default`): otherwise
  every script that ran `fedsim.run` ended with TFF's teardown traceback.
  """
  first = "tensorflow_federated" not in sys.modules
  with _without_cyclic_gc(first):
    import_tensorflow()  # deferring TFF's unused packages, also if TF came first
    module = import_quietly("tensorflow_federated")
  if first:
    atexit.register(_drop_tff_default)
  return module


@contextlib.contextmanager
def _without_cyclic_gc(active: bool) -> Iterator[None]:
  """Pauses the cyclic collector for the block, then `gc.freeze()`s all objects.

  Importing TensorFlow and TFF makes millions of long-lived objects (modules,
  classes, functions); the collector traversed them ~900 times during the
  import (~1 s of ~7 s) and each later full collection traverses them again
  (~0.25 s in the quickstart's first round). Frozen, they are never scanned
  again; what the import leaves as garbage (~2,000 objects) stays allocated.
  Results are unchanged: collection timing affects no computed value.
  """
  if not active:
    yield
    return
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()
  gc.freeze()


def _drop_tff_default() -> None:
  from fedsim.backend import contexts  # pylint: disable=g-import-not-at-top
  contexts.drop_default()


def _cap_python_loggers() -> None:
  # TF routes its Python logging through the "tensorflow" logger and TFF logs
  # through absl; NOTSET means the user has not chosen a level.
  tf_logger = logging.getLogger("tensorflow")
  if tf_logger.level == logging.NOTSET:
    tf_logger.setLevel(logging.WARNING)
  absl_logger = logging.getLogger("absl")
  if absl_logger.level == logging.NOTSET:
    absl_logger.setLevel(logging.WARNING)
  # tensor_encoding's bit packing logs a memory note on the root logger every
  # time an encoder is traced (over a dozen times per compressed run).
  root = logging.getLogger()
  if not any(isinstance(f, _BitpackingNoteFilter) for f in root.filters):
    root.addFilter(_BitpackingNoteFilter())
  # TFF's replacement of secure sums by their plain bodies (how fedsim runs
  # `secure` aggregation) builds assertions it never runs; TensorFlow logs each
  # as an ERROR with its stack, several screens per compiled round.
  if not any(isinstance(f, _UnusedOpFilter) for f in tf_logger.filters):
    tf_logger.addFilter(_UnusedOpFilter())


class _UnusedOpFilter(logging.Filter):
  """Drops the unused-assertion errors above, and the retracing warning a run
  with a controller triggers by design: each value of the controlled parameter
  compiles its own round from the same Python functions."""

  def filter(self, record: logging.LogRecord) -> bool:
    message = str(record.msg)
    return ("Object was never used" not in message
            and "triggered tf.function retracing" not in message)


class _BitpackingNoteFilter(logging.Filter):

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("This code path can temporarily allocate")


def _flush_stderr() -> None:
  # Python buffers sys.stderr; flushing before each dup2 keeps its text on the
  # side of the switch where it was written.
  for stream in (sys.stderr, sys.__stderr__):
    try:
      if stream is not None:
        stream.flush()
    except (OSError, ValueError):
      pass


def _write_all(fd: int, data: bytes) -> None:
  try:
    while data:
      data = data[os.write(fd, data):]
  except OSError:
    pass  # stderr went away (closed pipe); nothing better to do with it.
