"""Private TF, TFF, tensorflow_privacy and dp_accounting internals are used only in
fedsim/backend/, so an upgrade of those packages touches one package of fedsim;
tensor_encoding's (tensorflow_model_optimization) only in its one module,
compression/tensor_encoding_api.py: TFF is kept at arm's length."""

from __future__ import annotations

import ast
import importlib.util
import pathlib

FEDSIM = pathlib.Path(__file__).resolve().parents[2] / "fedsim"
BACKEND = FEDSIM / "backend"
TENSOR_ENCODING_MODULE = FEDSIM / "compression" / "tensor_encoding_api.py"
PACKAGES = {"tensorflow", "tensorflow_federated", "tensorflow_privacy", "dp_accounting"}
TENSOR_ENCODING = "tensorflow_model_optimization"
PUBLIC_SUBPACKAGES = {"dp_accounting.rdp", "dp_accounting.pld"}  # dp_accounting's documented API
NAMEDTUPLE_API = {"_asdict", "_replace", "_fields", "_make", "_field_defaults"}


def _is_internal(module: str) -> bool:
  """A submodule path of these packages (their public API is the top-level name)."""
  return "." in module and module not in PUBLIC_SUBPACKAGES


def _is_submodule(module: str, name: str) -> bool:
  """Whether `from module import name` imports a module (found without importing it)."""
  root = importlib.util.find_spec(module.split(".")[0])
  where = pathlib.Path(root.origin).parent.joinpath(*module.split(".")[1:], name)
  return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def _internals(tree: ast.AST) -> list[tuple[int, str, str]]:
  """(line, package or 'protected', what) for each internal use in `tree`.

  A protected attribute (`obj._x`, not on self or cls) counts in a module that
  imports one of the packages: there it is most likely theirs.
  """
  found, aliases = [], set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        root = alias.name.split(".")[0]
        if root in PACKAGES | {TENSOR_ENCODING}:
          aliases.add(alias.asname or root)
          if _is_internal(alias.name):
            found.append((node.lineno, root, f"import {alias.name}"))
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      root = node.module.split(".")[0]
      if root in PACKAGES | {TENSOR_ENCODING}:
        names = [a.name for a in node.names]
        if (_is_internal(node.module) or any(n.startswith("_") for n in names)
            or any(_is_submodule(node.module, n) for n in names if node.module != root)):
          found.append((node.lineno, root, f"from {node.module} import {', '.join(names)}"))
        aliases.add(root)
  for node in ast.walk(tree):
    if not aliases or not isinstance(node, ast.Attribute):
      continue
    chain, base = [node.attr], node.value
    while isinstance(base, ast.Attribute):
      chain.append(base.attr)
      base = base.value
    on_alias = isinstance(base, ast.Name) and base.id in aliases
    if on_alias and {"python", "internal"} & set(chain):
      found.append((node.lineno, "attribute", ast.unparse(node)))
    elif (node.attr.startswith("_") and not node.attr.startswith("__")
          and node.attr not in NAMEDTUPLE_API
          and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
      found.append((node.lineno, "protected", ast.unparse(node)))
  return found


def _allowed(path: pathlib.Path, kind: str) -> bool:
  if BACKEND in path.parents:
    return True
  return path == TENSOR_ENCODING_MODULE and kind in (TENSOR_ENCODING, "protected")


def test_internals_only_in_backend():
  found = sorted(f"{path.relative_to(FEDSIM.parent)}:{line}: {what}"
                 for path in FEDSIM.rglob("*.py")
                 for line, kind, what in _internals(ast.parse(path.read_text()))
                 if not _allowed(path, kind))
  assert found == []


def test_the_scan_sees_internal_imports_and_protected_reads():
  code = ("import tensorflow as tf\n"
          "from tensorflow_privacy.privacy.dp_query import gaussian_query\n"
          "from tensorflow_federated.python.aggregators import differential_privacy\n"
          "from dp_accounting import rdp\n"
          "def f(query, state):\n"
          "  from dp_accounting.rdp import rdp_privacy_accountant\n"
          "  tf.python.eager.context.context()\n"
          "  self._ok, state._replace(a=1)\n"
          "  return query._sum_query\n")
  assert {(line, kind) for line, kind, _ in _internals(ast.parse(code))} == {
      (2, "tensorflow_privacy"), (3, "tensorflow_federated"), (6, "dp_accounting"),
      (7, "attribute"), (9, "protected")}
