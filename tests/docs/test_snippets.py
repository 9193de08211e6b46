"""Every config, Python snippet and `fedsim` command the documentation shows works
(the rules: tests/docs/markdown_blocks.py)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys

import pytest

from tests.docs.markdown_blocks import ROOT, Block, blocks, commands, pages

RUNNER = pathlib.Path(__file__).with_name("snippet_runner.py")


def _all_blocks(lang: str) -> list[Block]:
  return [b for page in pages() for b in blocks(page) if b.lang == lang]


@pytest.fixture
def scratch(tmp_path):
  """The directory snippets run in: `experiments/` and every page's `file:` block."""
  (tmp_path / "experiments").symlink_to(ROOT / "experiments")
  for block in (b for page in pages() for b in blocks(page) if b.file):
    path = tmp_path / block.file
    assert not path.exists(), f"{block.where}: a second block writes {block.file}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block.code)
  return tmp_path


def _run(kind: str, snippets: list[dict], cwd: pathlib.Path, timeout: float) -> dict:
  """{where: error or None} from snippet_runner.py in a process group of its own,
  which is killed afterwards (nothing a snippet started outlives the test)."""
  source, results = cwd / f"{kind}_snippets.json", cwd / f"{kind}_results.json"
  source.write_text(json.dumps(snippets))
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
  child = subprocess.Popen([sys.executable, str(RUNNER), kind, str(source), str(results)],
                           cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    output, _ = child.communicate(timeout=timeout)
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(child.pid, signal.SIGKILL)
    child.wait()
  assert child.returncode == 0, output[-3000:]
  return json.loads(results.read_text())


def _snippet(block: Block) -> dict:
  return {"where": block.where, "page": str(block.page), "code": block.code, "file": block.file}


def test_every_yaml_block_is_a_valid_config(scratch):
  snippets = [_snippet(b) for b in _all_blocks("yaml") if not b.skip and not b.file]
  assert len(snippets) >= 10  # a parser that finds no block must fail: there are a dozen
  # Two that must fail, so a validator that accepts anything fails this test.
  bad = [{"where": "bad-model", "page": "x", "code": "model: {name: mpl}\n", "file": None},
         {"where": "bad-key", "page": "x", "code": "name: x\nrounds: 1\n", "file": None}]
  results = _run("yaml", snippets + bad, scratch, timeout=120)
  assert "unknown model 'mpl'" in results.pop("bad-model")
  assert results.pop("bad-key")
  failures = {where: error for where, error in results.items() if error}
  assert not failures, "\n".join(f"{w}: {e}" for w, e in failures.items())


@pytest.mark.slow
def test_every_python_block_runs(scratch):
  chosen = [b for b in _all_blocks("python") if not b.skip]
  snippets = [_snippet(b) for b in chosen]
  assert any("fedsim.run(" in s["code"] for s in snippets)
  failing = {"where": "failing", "page": "zz-failing", "code": "raise ValueError('x')\n",
             "file": None}
  results = _run("python", snippets + [failing], scratch, timeout=300)
  assert results.pop("failing").startswith("ValueError: x")
  failures = {where: error for where, error in results.items() if error}
  assert not failures, "\n".join(f"{w}: {e}" for w, e in failures.items())
  assert list(scratch.glob("runs/quickstart/*/metrics.csv"))  # a run really ran


def test_skipped_blocks_say_why():
  for page in pages():
    for block in blocks(page):
      assert block.skip is None or len(block.skip) > 10, f"{block.where}: give a reason"


def _parse(command: str) -> str | None:
  """None if `command` is one the CLI takes, else why not."""
  from fedsim.catalog import format_catalog
  from fedsim.cli import _parser
  from fedsim.errors import UserError
  words = shlex.split(command)[1:]
  parser = _parser()
  subcommands = parser._subparsers._group_actions[0].choices  # pylint: disable=protected-access
  if not words or words[0] not in subcommands:
    return f"no subcommand '{words[0] if words else ''}'"
  if re.search(r"\s\[|\s\||\.\.\.", command):
    return None  # a synopsis: the subcommand is real
  if len(words) == 1:
    return None  # the command named in a sentence
  stderr = io.StringIO()
  try:
    with contextlib.redirect_stderr(stderr):
      args = parser.parse_args(words)
  except SystemExit:
    return stderr.getvalue().strip().splitlines()[-1]
  if args.command == "list" and args.registry:
    try:
      format_catalog(args.registry)
    except UserError as e:
      return str(e)
  return None


def test_every_fedsim_command_shown_parses():
  shown = [(where, command) for page in pages() for where, command in commands(page)]
  assert len(shown) > 40
  errors = [f"{where}: {command}: {error}" for where, command in shown
            if (error := _parse(command))]
  assert not errors, "\n".join(errors)


@pytest.mark.parametrize("command", ["fedsim frobnicate x", "fedsim run --no-such-flag x.yaml",
                                     "fedsim list encoders2", "fedsim compare"])
def test_a_command_the_cli_refuses_is_caught(command):
  assert command == "fedsim compare" or _parse(command)
  if command == "fedsim compare":  # a bare mention in a sentence is allowed ...
    assert _parse(command) is None
    assert _parse("fedsim compare --target 0.9")  # ... a command missing its DIR is not
