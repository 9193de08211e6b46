"""The site's notebook pages (docs/notebooks/, executed copies with outputs)
are the tutorials of notebooks/ as they are now, executed top to bottom
without an error (docs/execute_notebooks.py writes them)."""

from __future__ import annotations

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "notebooks").glob("*.ipynb"))
PAGES = ROOT / "docs" / "notebooks"
RERUN = "rerun `uv run python docs/execute_notebooks.py`"


def test_every_notebook_has_a_page_and_every_page_a_notebook():
  assert SOURCES
  assert sorted(p.name for p in PAGES.glob("*.ipynb")) == [p.name for p in SOURCES], RERUN


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_a_page_is_its_notebook_executed_in_order_without_error(source):
  notebook = nbformat.read(source, as_version=4)
  page = nbformat.read(PAGES / source.name, as_version=4)
  nbformat.validate(page)
  assert [(c.cell_type, c.source) for c in page.cells] == [
      (c.cell_type, c.source) for c in notebook.cells], f"{source.name} changed: {RERUN}"
  code = [c for c in page.cells if c.cell_type == "code"]
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), (
      f"{source.name}: not executed top to bottom: {RERUN}")
  errors = [o for c in code for o in c.outputs if o.output_type == "error"]
  assert not errors, f"{source.name}: {errors[0].ename}: {errors[0].evalue}"
  assert any(o.output_type in ("display_data", "execute_result") for c in code
             for o in c.outputs), f"{source.name}: no result or figure shown"
