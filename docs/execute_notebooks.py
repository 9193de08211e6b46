"""Executes the tutorial notebooks at their tutorial size and stores the
executed copies, outputs included, as the site's pages (docs/notebooks/).

  uv run python docs/execute_notebooks.py [NAME ...]   # default: every notebook

notebooks/ keeps the notebooks without outputs (what a user opens and edits);
the site renders docs/notebooks/ (mkdocs-jupyter, never executed at build
time: a build stays seconds long). `tests/docs/test_notebook_pages.py` fails
when a notebook changed after its page was executed: rerun this script then.
Runs go to a temporary directory, deleted at the end, whose path the pages
show as `runs` (the notebooks' default logdir, `runs/` of the repository), so
a page reads as a user's run and does not change with the directory; no
TensorBoard server is started (FEDSIM_NOTEBOOK_TENSORBOARD=0).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ROOT / "notebooks"
PAGES = ROOT / "docs" / "notebooks"
CELL_TIMEOUT_S = 1800
SHOWN_LOGDIR = "runs"  # what the pages show for the temporary logdir


def stable_paths(notebook, logdir: str, shown: str = SHOWN_LOGDIR) -> None:
  """Replaces `logdir` by `shown` in every text output of `notebook` (streams,
  text results and tracebacks; images are left alone), in place."""

  def replaced(value):
    if isinstance(value, str):
      return value.replace(logdir, shown)
    if isinstance(value, list):
      return [replaced(v) for v in value]
    if isinstance(value, dict):
      return type(value)((k, v if k.startswith("image/") else replaced(v))
                         for k, v in value.items())
    return value

  for cell in notebook.cells:
    for output in cell.get("outputs", []):
      for key in ("text", "data", "traceback", "evalue"):
        if key in output:
          output[key] = replaced(output[key])


def main() -> None:
  import nbclient  # pylint: disable=g-import-not-at-top
  import nbformat  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("names", nargs="*", help="notebook file names; default: all")
  args = parser.parse_args()
  paths = [SOURCES / name for name in args.names] or sorted(SOURCES.glob("*.ipynb"))
  PAGES.mkdir(parents=True, exist_ok=True)
  logdir = pathlib.Path(tempfile.mkdtemp(prefix="fedsim-notebooks-"))
  os.environ.update(FEDSIM_NOTEBOOK_LOGDIR=str(logdir), FEDSIM_NOTEBOOK_TENSORBOARD="0",
                    TF_CPP_MIN_LOG_LEVEL="2")
  os.environ.pop("MPLBACKEND", None)  # a set one (agg) would leave the pages without figures
  try:
    for path in paths:
      notebook = nbformat.read(path, as_version=4)
      # `uv run` puts the venv first on PATH: its `python3` kernel is the venv's Python.
      client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                       resources={"metadata": {"path": str(SOURCES)}})
      client.execute()
      stable_paths(notebook, str(logdir))
      nbformat.write(notebook, PAGES / path.name)
      print(PAGES / path.name)
  finally:
    shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
  main()
