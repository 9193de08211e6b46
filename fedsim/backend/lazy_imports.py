"""TFF's differential-privacy packages, imported when first used instead of with TFF.

`import tensorflow_federated` (0.87) imports tensorflow_privacy and
dp_accounting for its DP aggregators, and with them TensorFlow Probability,
SciPy's stats and the privacy-loss-distribution accountant: about 2 s of an
~8.5 s import on a quiet machine (bench/startup.py), paid by every run, private
or not.

`defer()` puts a finder first on `sys.meta_path` for those two packages. When
they are imported, the module object is created as usual (spec, `__file__`,
`__loader__`, the parent's attribute) but its code does not run yet; it runs in
that same object, as an eager import would have run it, the first time anything
reads an attribute the module does not have yet. `__path__` is held back until
then, so importing a submodule (`from tensorflow_privacy.privacy import ...`)
runs the package first, in the order an eager import would. The code runs at
TensorFlow's top level (`tf.init_scope`), as it did when TFF was imported, even if
the first use is inside a traced function. Once run, the module is a plain
module: callers cannot tell it from an eagerly imported one.
(This is `importlib.util.LazyLoader`'s scheme, plus the one exception below.)

The exception: while TFF 0.87 is imported, its modules read three names of
these packages, each only as a type annotation of a function it defines
(`DifferentiallyPrivateFactory._create_from_query(query: tfp.DPQuery)`,
`PrivateQuantileEstimationProcess(quantile_estimator_query:
tfp.QuantileEstimatorQuery)`, `extract_dp_event_from_state(...) ->
dp_accounting.DpEvent`). Read from the body of a TFF module or class (never
from a function, which is where TFF uses these packages), those names are
given as the string the annotation spells, as `from __future__ import
annotations` would have stored it. Any other read runs the package. A TFF
that reads more names at import is therefore only slower, never wrong.

This module is the only place that knows which TFF internals read what.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import inspect
import sys
import threading
import types

# Package -> names TFF 0.87 reads from it while it is imported, each only as a
# type annotation (see the module docstring), and how TFF spells the package.
DEFERRED = {
    "tensorflow_privacy": ("tfp", frozenset({"DPQuery", "QuantileEstimatorQuery"})),
    "dp_accounting": ("dp_accounting", frozenset({"DpEvent"})),
}
_ANNOTATING = "tensorflow_federated."
# Run one deferred package at a time, re-entrantly: running tensorflow_privacy
# imports dp_accounting in the same thread.
_LOCK = threading.RLock()


def defer() -> None:
  """Installs the finder (once); packages already imported stay as they are."""
  with _LOCK:
    if not any(isinstance(finder, _DeferringFinder) for finder in sys.meta_path):
      sys.meta_path.insert(0, _DeferringFinder())


class _DeferringFinder(importlib.abc.MetaPathFinder):

  def find_spec(self, fullname, path, target=None):
    if fullname not in DEFERRED:
      return None
    for finder in sys.meta_path:
      if finder is self or not hasattr(finder, "find_spec"):
        continue
      spec = finder.find_spec(fullname, path, target)
      if spec is not None:
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
          return spec
        spec.loader = _DeferringLoader(spec.loader)
        return spec
    return None


class _DeferringLoader(importlib.abc.Loader):

  def __init__(self, loader):
    self.loader = loader

  def create_module(self, spec):
    return self.loader.create_module(spec)

  def exec_module(self, module) -> None:
    state = module.__dict__
    state["_fedsim_deferred"] = (self.loader, state.pop("__path__", None))
    module.__class__ = _DeferredModule


class _DeferredModule(types.ModuleType):
  """A module whose code runs at the first read of a name it lacks (or `dir()`)."""

  def __getattr__(self, name):
    state = types.ModuleType.__getattribute__(self, "__dict__")
    with _LOCK:
      deferred = state.get("_fedsim_deferred")
      if deferred is None:  # running in this thread, or already run
        return types.ModuleType.__getattribute__(self, name)
      annotation = _annotation(state["__name__"], name)
      if annotation is not None:
        return annotation
      _run(self, state, deferred)
    return getattr(self, name)

  def __dir__(self):  # the names the code defines, as after an eager import
    state = types.ModuleType.__getattribute__(self, "__dict__")
    with _LOCK:
      deferred = state.get("_fedsim_deferred")
      if deferred is not None:
        _run(self, state, deferred)
    return types.ModuleType.__dir__(self)


def _run(module, state, deferred) -> None:
  loader, path = deferred
  del state["_fedsim_deferred"]
  spec = state["__spec__"]
  spec.loader = loader
  state["__loader__"] = loader
  if path is not None:
    state["__path__"] = path
  # Run as the eager import ran it, at top level: a first use inside a traced
  # TensorFlow function must not put the package's module-level tensors in its graph.
  tf = sys.modules.get("tensorflow")
  top_level = tf.init_scope() if hasattr(tf, "init_scope") else contextlib.nullcontext()
  try:
    with top_level:
      loader.exec_module(module)
  except BaseException:
    # As a failed eager import does: the next import starts afresh.
    if sys.modules.get(spec.name) is module:
      del sys.modules[spec.name]
    raise
  module.__class__ = types.ModuleType


def _annotation(package: str, name: str) -> str | None:
  spelled, names = DEFERRED[package]
  if name not in names:
    return None
  # Two frames up: this function's caller is __getattr__, whose caller read the name.
  reader = inspect.currentframe().f_back.f_back
  body = not reader.f_code.co_flags & inspect.CO_OPTIMIZED  # module or class body
  if body and str(reader.f_globals.get("__name__", "")).startswith(_ANNOTATING):
    return f"{spelled}.{name}"
  return None
