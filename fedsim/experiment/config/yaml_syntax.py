"""The YAML that configs are written in: safe YAML 1.1, minus two of its traps.

PyYAML implements YAML 1.1, where `1e-3` is the *string* '1e-3' (a float
needs a dot and a signed exponent, `1.0e-3`), so `learning_rate: 1e-3` would
be refused as "expected a number". Here any number in scientific notation is
a float, as in YAML 1.2 and JSON. YAML also lets a later duplicate key
silently replace an earlier one; here it is an error naming the key and line.
Everything else is `yaml.SafeLoader`: no object tags, no code.
"""

from __future__ import annotations

import re
from typing import Any, TextIO

import yaml

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


class ConfigLoader(yaml.SafeLoader):
  """`yaml.SafeLoader` with scientific-notation floats and duplicate keys refused."""

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
