"""The YAML that configs are written in: safe YAML 1.1, minus two of its traps.

PyYAML implements YAML 1.1, where `1e-3` is the *string* '1e-3' (a float
needs a dot and a signed exponent, `1.0e-3`), so `learning_rate: 1e-3` would
be refused as "expected a number". Here any number in scientific notation is
a float, as in YAML 1.2 and JSON. YAML also lets a later duplicate key
silently replace an earlier one; here it is an error naming the key and line.
Everything else is `yaml.SafeLoader`: no object tags, no code.

Configs are small, so what is not small is refused before it is built: more
than MAX_DEPTH levels of nesting (the composer recurses per level), or more
than MAX_NODES values once aliases are expanded (`&a [*b, *b, ...]` chains
double per line: a "billion laughs" of a few hundred bytes).
"""

from __future__ import annotations

import re
from typing import Any, TextIO

import yaml

MAX_DEPTH = 100
MAX_NODES = 1_000_000
_FLOAT_TAG = "tag:yaml.org,2002:float"
_FLOAT = re.compile(r"""^(?:
    [-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?   # 1.5  1.  1.5e3  1.5e-3
  | [-+]?[0-9][0-9_]*[eE][-+]?[0-9]+                 # 1e3  1e-3  2E+5
  | [-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?          # .5  .5e-3
  | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*      # sexagesimal, as YAML 1.1
  | [-+]?\.(?:inf|Inf|INF)
  | \.(?:nan|NaN|NAN))$""", re.VERBOSE)


class DuplicateKeyError(yaml.constructor.ConstructorError):
  """A mapping names the same key twice; `key` and `line` (1-based) say where."""

  def __init__(self, key: Any, mark: yaml.Mark):
    super().__init__(None, None, f"duplicate key '{key}'", mark)
    self.key, self.line = key, mark.line + 1


class TooLargeError(yaml.YAMLError):
  """Nested deeper than MAX_DEPTH or expanding beyond MAX_NODES values."""

  def __init__(self, problem: str, mark: yaml.Mark | None):
    super().__init__(problem)
    self.problem, self.problem_mark = problem, mark


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
  """Values `node` stands for with every alias expanded (memoized by node)."""
  if id(node) not in sizes:
    if isinstance(node, yaml.MappingNode):
      children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
      children = node.value
    else:
      children = []
    sizes[id(node)] = 1 + sum(_expanded_size(child, sizes) for child in children)
  return sizes[id(node)]


class ConfigLoader(yaml.SafeLoader):
  """`yaml.SafeLoader` with scientific-notation floats and duplicate keys
  refused, and too deep or too large (alias-expanded) documents refused."""

  _depth = 0

  def compose_node(self, parent, index):
    self._depth += 1
    try:
      if self._depth > MAX_DEPTH:
        raise TooLargeError(f"nested more than {MAX_DEPTH} levels deep",
                            self.peek_event().start_mark)
      return super().compose_node(parent, index)
    finally:
      self._depth -= 1

  def compose_document(self):
    node = super().compose_document()
    # Aliases share nodes: the graph is small, its expansion need not be.
    try:
      size = _expanded_size(node, {})
    except RecursionError:  # a chain of aliases, each nesting the previous
      raise TooLargeError(f"nested more than {MAX_DEPTH} levels deep through aliases",
                          node.start_mark) from None
    if size > MAX_NODES:
      raise TooLargeError(f"more than {MAX_NODES:,} values once its aliases (*name) are"
                          " expanded", node.start_mark)
    return node

  def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
      if key_node.tag == "tag:yaml.org,2002:merge":
        continue  # `<<: *base` keys may be overridden: that is what merging is for
      key = self.construct_object(key_node, deep=True)
      try:
        if key in seen:
          raise DuplicateKeyError(key, key_node.start_mark)
        seen.add(key)
      except TypeError:
        continue  # an unhashable key: SafeLoader's own error names it below
    return super().construct_mapping(node, deep=deep)


# The base class's resolvers without its float rule, then the wider one; it
# comes after the int rule, so `10` stays an int.
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _FLOAT_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ConfigLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))


def load(stream: str | TextIO) -> Any:
  """The data in YAML `stream`.

  Raises:
    DuplicateKeyError: for a key given twice in one mapping.
    yaml.YAMLError: for anything else that is not valid YAML.
  """
  return yaml.load(stream, Loader=ConfigLoader)  # noqa: S506 (a SafeLoader subclass)
