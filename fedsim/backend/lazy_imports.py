"""Packages TFF and TensorFlow import but a fedsim run rarely uses, imported when
first used instead of at start-up.

`import tensorflow_federated` (0.87) imports tensorflow_privacy and
dp_accounting for its DP aggregators, and with them TensorFlow Probability,
SciPy's stats and the privacy-loss-distribution accountant, paid by every run,
private or not. JAX is imported by TensorFlow's TFLite converter (for
converting JAX functions) and by TFF's JAX front end (`tff.jax`), neither of
which fedsim uses. Importing TensorFlow and TFF in a fresh process with their
bytecode installed, on a quiet machine: 2.4 s wall with these packages, 1.7 s
deferred (without installed bytecode, ~3 s of ~9 s).

`defer()` puts a finder first on `sys.meta_path` for those packages. When
they are imported, the module object is created as usual (spec, `__file__`,
`__loader__`, the parent's attribute) but its code does not run yet; it runs in
that same object, as an eager import would have run it, the first time anything
reads an attribute the module does not have yet. `__path__` is held back until
then, so importing a submodule (`from tensorflow_privacy.privacy import ...`)
runs the package first, in the order an eager import would. The code runs at
TensorFlow's top level (`tf.init_scope`), as it did when TFF was imported, even if
the first use is inside a traced function. Once run, the module is a plain
module: callers cannot tell it from an eagerly imported one.
(This is `importlib.util.LazyLoader`'s scheme, plus the two exceptions below.)

The exceptions are names read by the one package named for them here: from
the body of a module while it is imported (`READ_AT_IMPORT`, and TFF's
annotations), or from a function only to ask whether a value is an instance
(`TYPE_PROBES`); any other read runs the package:
- While TFF 0.87 is imported, its modules read three names of the DP packages,
  each only as a type annotation of a function it defines
  (`DifferentiallyPrivateFactory._create_from_query(query: tfp.DPQuery)`,
  `PrivateQuantileEstimationProcess(quantile_estimator_query:
  tfp.QuantileEstimatorQuery)`, `extract_dp_event_from_state(...) ->
  dp_accounting.DpEvent`). They get the string the annotation spells, as `from
  __future__ import annotations` would have stored it.
- TensorFlow's TFLite utilities bind `jax.xla_computation` at import (`from jax
  import xla_computation`), to call it when a JAX function is converted. They get
  a stand-in that runs JAX and calls the real function when it is called (and, as
  that statement first asks whether JAX is a package, no `__path__`).
- Matplotlib asks whether each value it plots is a JAX array (`cbook`'s
  `_is_jax_array` reads `jax.Array` from whatever module is `sys.modules["jax"]`)
  and would run JAX for every `fedsim run` that draws a study's plot. Until JAX
  has run no JAX array can exist, so it gets a class nothing is an instance of.
A TFF or TensorFlow that reads more names at import is therefore only slower,
never wrong.

This module is the only place that knows which TFF internals (and which other
readers) read what.
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
    "jax": ("jax", frozenset()),
    # `tff.jax`: importing it imports JAX and registers TFF's JAX types with it.
    "tensorflow_federated.python.core.environments.jax": ("tff.jax", frozenset()),
}
_ANNOTATING = "tensorflow_federated."
# (package, name) -> the package whose module bodies read that name at import, to
# call it later: they get a stand-in that runs the package when called.
READ_AT_IMPORT = {("jax", "xla_computation"): "tensorflow.lite."}
# (package, type) -> the package whose functions read it only to ask whether a
# value is an instance: before the package has run, none can be.
TYPE_PROBES = {("jax", "Array"): "matplotlib."}
_NO_INSTANCES: dict = {}
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
      stand_in = _stand_in(self, state["__name__"], name)
      if stand_in is not None:
        return stand_in
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


def _stand_in(module, package: str, name: str):
  """What a module body importing now gets for `package.name` without running
  `package` (see the module docstring), or None: the read runs the package."""
  # Two frames up: this function's caller is __getattr__, whose caller read the name.
  reader = inspect.currentframe().f_back.f_back
  importer = str(reader.f_globals.get("__name__", ""))
  prober = TYPE_PROBES.get((package, name))
  if prober is not None and importer.startswith(prober):
    if (package, name) not in _NO_INSTANCES:  # one class, whatever reads it (per plotted value)
      _NO_INSTANCES[package, name] = type(name, (), {
          "__module__": package, "__doc__": f"No value is a {package}.{name} before {package} runs."})
    return _NO_INSTANCES[package, name]
  if reader.f_code.co_flags & inspect.CO_OPTIMIZED:  # a function, not a module or class body
    return None
  spelled, annotations = DEFERRED[package]
  if name in annotations and importer.startswith(_ANNOTATING):
    return f"{spelled}.{name}"
  if name == "__path__" and any(
      package == deferred and importer.startswith(caller)
      for (deferred, _), caller in READ_AT_IMPORT.items()):
    # `from package import name` asks the package for its path first, to import
    # submodules the names may be; without one it reads the names directly.
    raise AttributeError(name)
  caller = READ_AT_IMPORT.get((package, name))
  if caller is not None and importer.startswith(caller):
    def called_later(*args, **kwargs):
      return getattr(module, name)(*args, **kwargs)
    called_later.__name__ = called_later.__qualname__ = name
    return called_later
  return None
