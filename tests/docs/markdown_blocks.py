"""The code a reader of the documentation copies: fenced blocks and `fedsim` commands.

Rules the tests apply (docs/explain/development.md states them for writers):
- a ```yaml block is a config: a full one when it has a top-level `name`, else a
  fragment laid over experiments/quickstart.yaml as a variant is;
- a ```python block runs, in order with the other blocks of its page, in one
  namespace per page, with the working directory a scratch directory that has
  `experiments/`;
- `<!-- file: PATH -->` on the line before a block writes the block to PATH in that
  directory instead (a plugin or module the page's configs and code import);
- `<!-- skip: REASON -->` on the line before a block leaves it out of both;
- every `fedsim ...` command line, in a block or an inline code span, parses with the
  CLI's own parser (a synopsis with `[...]`, `|` or `...` only names a real subcommand).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>skip|file):\s*(?P<value>.*?)\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
  page: pathlib.Path
  line: int          # 1-based line of the opening fence
  lang: str          # first word of the info string ('' for none)
  code: str
  skip: str | None   # the reason, when marked <!-- skip: ... -->
  file: str | None   # the path, when marked <!-- file: ... -->

  @property
  def where(self) -> str:
    return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[pathlib.Path]:
  """README.md and every Markdown page under docs/."""
  return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(page: pathlib.Path) -> list[Block]:
  """The fenced code blocks of a page, in order."""
  lines = page.read_text(encoding="utf-8").splitlines()
  found, i = [], 0
  while i < len(lines):
    opening = _FENCE.match(lines[i])
    if not opening:
      i += 1
      continue
    fence, indent = opening["fence"], len(opening["indent"])
    end = i + 1
    while end < len(lines) and not (lines[end].strip().startswith(fence)
                                    and set(lines[end].strip()) == {fence[0]}):
      end += 1
    # A block indented under a list item loses that indentation, no more.
    code = "\n".join(line[indent:] if line[:indent].isspace() else line
                     for line in lines[i + 1:end])
    before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
    marker = _MARKER.match(before)
    found.append(Block(page, i + 1, opening["info"].strip().split(" ")[0].lower(),
                       code + "\n",
                       marker["value"] if marker and marker["kind"] == "skip" else None,
                       marker["value"] if marker and marker["kind"] == "file" else None))
    i = end + 1
  return found


def commands(page: pathlib.Path) -> list[tuple[str, str]]:
  """(where, command line) for every `fedsim ...` command the page shows: lines of
  shell-like fenced blocks and inline code spans, `uv run ` and `$ ` stripped,
  a trailing `# comment` dropped."""
  found = []
  text = page.read_text(encoding="utf-8")
  in_block = set()
  for block in blocks(page):
    if block.lang in ("", "bash", "sh", "shell", "console", "text"):
      for offset, line in enumerate(block.code.splitlines(), 1):
        command = _command(line)
        if command:
          found.append((f"{block.where}+{offset}", command))
    in_block.update(range(block.line, block.line + block.code.count("\n") + 2))
  # Inline spans may wrap across lines: read each paragraph as one line.
  paragraph, start = [], 0
  for number, line in enumerate([*text.splitlines(), ""], 1):
    if number in in_block or not line.strip():
      for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", " ".join(paragraph)):
        command = _command(span)
        if command:
          found.append((f"{page.relative_to(ROOT)}:{start}", command))
      paragraph = []
      continue
    if not paragraph:
      start = number
    paragraph.append(line.strip())
  return found


def _command(text: str) -> str | None:
  text = text.strip()
  for prefix in ("$ ", "pip install uv && ", "uv run "):
    text = text.removeprefix(prefix)
  if not text.startswith("fedsim "):
    return None
  return re.split(r"\s+#\s", text, maxsplit=1)[0].strip()
