"""Suite-wide fixtures. Tests that execute TFF computations take `tff_runtime`,
which runs them on one fedsim-owned worker for the whole session."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest


@pytest.fixture(scope="session")
def tff_runtime(tmp_path_factory):
  from fedsim.runtime import worker
  log = tmp_path_factory.mktemp("tff-worker") / "worker.log"
  with worker.session(str(log)) as w:
    yield w
