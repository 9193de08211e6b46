"""Tiny files in TFF's SQLite format, one per dataset, in a fresh cache directory."""

from __future__ import annotations

import pytest

from tests.datasets import tff_sqlite

_ROWS = {
    "emnist_all.sqlite": lambda: tff_sqlite.emnist_rows() + tff_sqlite.emnist_rows(
        clients=2, prefix="all", classes=62),
    "shakespeare.sqlite": tff_sqlite.shakespeare_rows,
    "stackoverflow.sqlite": tff_sqlite.stackoverflow_rows,
    "cifar100.sqlite": tff_sqlite.cifar100_rows,
}


@pytest.fixture(params=[False, True], ids=["no_index", "client_index"])
def cache_dir(request, tmp_path):
  """A cache directory with all four files; with and without an index on client_id."""
  for name, rows in _ROWS.items():
    tff_sqlite.write(tmp_path / name, rows(), index=request.param)
  return tmp_path
