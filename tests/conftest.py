"""Suite-wide fixtures. Tests that execute TFF computations take `tff_runtime`,
which runs them on one fedsim-owned worker for the whole session."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest


@pytest.fixture(scope="session")
def tff_runtime(tmp_path_factory):
  from fedsim import runtime
  from fedsim.runtime.session import session
  runtime.install_guard()
  log = tmp_path_factory.mktemp("tff-worker") / "worker.log"
  with session(str(log)) as w:
    yield w


@pytest.fixture(autouse=True)
def _tff_guard():
  """Once a test module has imported TFF, computations called outside a run
  or `tff_runtime` start a fedsim-owned worker, never TFF's own (which would
  outlive pytest and hold its pipes). Importing TFF costs ~10 s, so it is not
  imported here for tests that do not need it."""
  if "tensorflow_federated" in sys.modules:
    from fedsim import runtime
    runtime.install_guard()
  yield
