"""The documentation site builds with warnings as errors, its generated reference
lists every registry entry `fedsim list` lists, and README stays a front page."""

from __future__ import annotations

import html
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from tests.docs.markdown_blocks import ROOT


def _build(config: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess:
  # NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2.0 is not a build warning.
  return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                         "-d", str(site)], capture_output=True, text=True, timeout=300,
                        stdin=subprocess.DEVNULL, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  site = tmp_path_factory.mktemp("site")
  built = _build(ROOT / "mkdocs.yml", site)
  assert built.returncode == 0, built.stderr[-3000:]
  assert "WARNING" not in built.stderr, built.stderr[-3000:]
  return site


def test_the_site_builds_strict_with_every_page(site):
  for page in ("index.html", "start/quickstart/index.html", "reference/registries/index.html",
               "reference/config/index.html", "tensorboard/index.html", "chaos/index.html"):
    assert (site / page).is_file(), page
  # Every page under docs/ is in the nav (strict also refuses one left out).
  nav = (ROOT / "mkdocs.yml").read_text()
  for page in (ROOT / "docs").rglob("*.md"):
    assert str(page.relative_to(ROOT / "docs")) in nav, f"{page} is not in mkdocs.yml's nav"


def test_a_broken_anchor_fails_the_strict_build(tmp_path):
  shutil.copytree(ROOT / "docs", tmp_path / "docs")
  shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
  page = tmp_path / "docs" / "start" / "quickstart.md"
  page.write_text(page.read_text() + "\nSee [nowhere](configs.md#no-such-section).\n")
  built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
  assert built.returncode != 0
  assert "no-such-section" in built.stderr


def _fedsim_list() -> list[tuple[str, str, str]]:
  """(registry, entry, parameters) for each entry, from `fedsim list`'s own output, in a
  fresh process as the site's build has (tests here register entries of their own)."""
  listed = subprocess.run([sys.executable, "-m", "fedsim.cli", "list"], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL, cwd=ROOT)
  assert listed.returncode == 0, listed.stderr[-2000:]
  rows = []
  for line in listed.stdout.splitlines():
    if line and not line.startswith(" "):
      registry, name, params = re.match(r"(\S+) (\S+)\s+(.*)$", line).groups()
      rows.append((registry, name, params))
  return rows


def test_the_reference_lists_every_entry_fedsim_list_lists(site):
  page = html.unescape((site / "reference" / "registries" / "index.html").read_text())
  text = re.sub(r"<[^>]+>", "", page)
  sections = dict(re.findall(r'<h2 id="([^"]+)">(.*?)(?=<h2 id=|$)', page, flags=re.S))
  listed = _fedsim_list()
  assert len(listed) > 60 and len({r for r, _, _ in listed}) >= 10
  for registry, name, params in listed:
    assert registry in sections, f"no section for registry {registry}"
    row = re.search(rf"<tr>\s*<td><code>{re.escape(name)}</code></td>(.*?)</tr>",
                    sections[registry], flags=re.S)
    assert row, f"{registry} {name} is not in the reference"
    cells = re.sub(r"<[^>]+>", "", row.group(1))
    if params == "(no parameters)":
      assert "(no parameters)" in cells
      continue
    for param in re.findall(r"(?:^|, )([a-z_0-9]+): ", params):
      assert f"{param}: " in cells, f"{registry} {name}: parameter {param} missing"
    # The defaults as `fedsim list` prints them, e.g. "bits: int = 8".
    for text_piece in re.findall(r"[a-z_0-9]+: [^,=]+ = [^,(]+", params):
      assert text_piece.strip() in cells, f"{registry} {name}: '{text_piece}' missing"
  assert "dp_gaussian" in text


def test_the_config_reference_has_every_schema_key(site):
  from fedsim.experiment.config.schema import ExperimentConfig
  import dataclasses
  page = html.unescape(re.sub(r"<[^>]+>", "",
                              (site / "reference" / "config" / "index.html").read_text()))
  for field in dataclasses.fields(ExperimentConfig):
    assert f"\n{field.name}\n" in page, field.name
  for key in ("eval.holdout_fraction", "checkpoint.keep", "system.profiles.up_bps.median"):
    assert f"\n{key}\n" in page, key


README = ROOT / "README.md"


def test_readme_is_a_front_page_with_the_two_commands():
  text = README.read_text()
  assert len(text.splitlines()) < 250
  assert "pip install uv && uv run fedsim run experiments/quickstart.yaml" in text
  assert "pip install uv && uv run pytest" in text
  assert "uv run mkdocs build --strict" in text and "uv run mkdocs serve" in text


def test_readme_links_point_at_files_that_exist():
  links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
  local = [link for link in links if "://" not in link]
  assert len(local) > 10
  missing = [link for link in local if not (ROOT / link).exists()]
  assert not missing, missing
