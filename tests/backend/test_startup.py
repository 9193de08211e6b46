"""What shortens start-up. Deferred packages (fedsim/backend/lazy_imports.py): the
code runs once, at first use, in the module object importers already hold, in the
order an eager import runs it; TFF's import-time annotations get strings, every
other read the package. The first TFF import runs without the cyclic GC (quiet.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import pytest

from fedsim.backend import lazy_imports

PACKAGE = """
import builtins
builtins.fedsim_test_ran.append(__name__)
class Annot:
  pass
class Other:
  pass
def twice(x):
  return 2 * x
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
  """A package `fedsim_fake_dp` (with submodule `sub`) deferred like tensorflow_privacy."""
  root = tmp_path / "fedsim_fake_dp"
  root.mkdir()
  (root / "__init__.py").write_text(PACKAGE)
  (root / "sub.py").write_text(PACKAGE + "from fedsim_fake_dp import Annot as PARENTS\n")
  (tmp_path / "fedsim_fake_broken.py").write_text("raise RuntimeError('broken on purpose')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(lazy_imports, "DEFERRED", {
      "fedsim_fake_dp": ("fake", frozenset({"Annot"})),
      "fedsim_fake_broken": ("broken", frozenset())})
  monkeypatch.setattr(lazy_imports, "READ_AT_IMPORT", {("fedsim_fake_dp", "twice"): "tf.lite."})
  monkeypatch.setattr("builtins.fedsim_test_ran", [], raising=False)
  lazy_imports.defer()
  yield sys.modules.get
  for name in [n for n in sys.modules if n.startswith("fedsim_fake_")]:
    del sys.modules[name]


def _exec(code: str, module: dict) -> None:
  # Not inheriting this file's `from __future__ import annotations`: TFF's modules
  # evaluate their annotations.
  exec(compile(code, "<module>", "exec", dont_inherit=True), module)  # pylint: disable=exec-used


def _ran():
  import builtins
  return builtins.fedsim_test_ran


def _deferred(name: str) -> bool:
  """Module `name` is imported but its code has not run yet."""
  return isinstance(sys.modules.get(name), lazy_imports._DeferredModule)  # pylint: disable=protected-access


def test_code_runs_once_at_the_first_read_in_the_same_object(fake):
  import fedsim_fake_dp as held
  assert _ran() == [] and _deferred("fedsim_fake_dp")
  assert held.__name__ == "fedsim_fake_dp" and held.__file__.endswith("__init__.py")
  other = held.Other
  assert _ran() == ["fedsim_fake_dp"]
  assert type(held) is types.ModuleType and fake("fedsim_fake_dp") is held
  import fedsim_fake_dp
  assert fedsim_fake_dp.Other is other and _ran() == ["fedsim_fake_dp"]
  with pytest.raises(AttributeError):
    held.missing  # pylint: disable=pointless-statement


def test_dir_runs_the_code_and_lists_its_names(fake):
  import fedsim_fake_dp
  assert {"Annot", "Other"} <= set(dir(fedsim_fake_dp)) and _ran() == ["fedsim_fake_dp"]


def test_a_submodule_import_runs_the_package_first(fake):
  import fedsim_fake_dp  # noqa: F401
  import fedsim_fake_dp.sub  # the import system reads the package's __path__ only
  assert _ran() == ["fedsim_fake_dp", "fedsim_fake_dp.sub"]
  assert fedsim_fake_dp.sub.PARENTS is fedsim_fake_dp.Annot


def test_tff_import_time_annotations_are_strings_and_other_reads_run_the_package(fake):
  import fedsim_fake_dp
  code = ("def build(query: fake.Annot) -> fake.Annot: pass\n"
          "class Process:\n  def __init__(self, query: fake.Annot): pass\n"
          "def later():\n  return fake.Annot\n")
  tff_module = {"__name__": "tensorflow_federated.python.aggregators.x", "fake": fedsim_fake_dp}
  _exec(code, tff_module)
  assert tff_module["build"].__annotations__ == {"query": "fake.Annot", "return": "fake.Annot"}
  assert tff_module["Process"].__init__.__annotations__ == {"query": "fake.Annot"}
  assert _ran() == []
  assert tff_module["later"]() is fedsim_fake_dp.Annot  # a read inside a function: the class
  assert _ran() == ["fedsim_fake_dp"]


@pytest.mark.parametrize("reader", ["fedsim.api", "tensorflow_federated.python.x"])
def test_names_not_listed_or_read_outside_tff_run_the_package(fake, reader):
  import fedsim_fake_dp
  name = "Annot" if reader == "fedsim.api" else "Other"
  module = {"__name__": reader, "fake": fedsim_fake_dp}
  _exec(f"def build(query: fake.{name}): pass\n", module)
  assert module["build"].__annotations__["query"] is getattr(fedsim_fake_dp, name)
  assert _ran() == ["fedsim_fake_dp"]


def test_a_name_bound_at_import_to_call_later_is_a_stand_in_that_runs_the_package(fake):
  import fedsim_fake_dp
  module = {"__name__": "tf.lite.util", "fake": fedsim_fake_dp}
  _exec("from fedsim_fake_dp import twice as _twice\nTWICE = fake.twice\n", module)
  assert _ran() == [] and _deferred("fedsim_fake_dp")
  stand_in = module["TWICE"]
  assert stand_in and stand_in.__name__ == "twice"  # TFLite tests it with `if not`
  assert stand_in(21) == 42 and _ran() == ["fedsim_fake_dp"]
  assert module["_twice"](4) == 8 and _ran() == ["fedsim_fake_dp"]


@pytest.mark.parametrize("reader", ["tf.python.util", "inside a function"])
def test_the_stand_in_is_only_for_the_named_readers_module_bodies(fake, reader):
  import fedsim_fake_dp
  module = {"__name__": "tf.lite.util" if reader == "inside a function" else reader,
            "fake": fedsim_fake_dp}
  code = ("def later():\n  return fake.twice\nGOT = later()\n" if reader == "inside a function"
          else "GOT = fake.twice\n")
  _exec(code, module)
  assert _ran() == ["fedsim_fake_dp"]
  assert module["GOT"] is fedsim_fake_dp.twice


@pytest.mark.parametrize("reader", ["matplotlib.cbook", "fedsim.reporting"])
def test_a_type_probe_before_the_package_runs_matches_nothing(fake, monkeypatch, reader):
  import fedsim_fake_dp
  monkeypatch.setattr(lazy_imports, "TYPE_PROBES", {("fedsim_fake_dp", "Other"): "matplotlib."})
  module = {"__name__": reader, "sys": sys}
  _exec("def probe(x):\n  tp = sys.modules['fedsim_fake_dp'].Other\n"
        "  return isinstance(tp, type) and isinstance(x, tp)\n", module)
  if reader == "fedsim.reporting":   # not the named reader: the package runs
    assert module["probe"](1.0) is False and _ran() == ["fedsim_fake_dp"]
    return
  assert module["probe"](1.0) is False and module["probe"](object()) is False
  assert _ran() == [] and _deferred("fedsim_fake_dp")
  other = fedsim_fake_dp.Annot   # any other read runs it; then the probe sees the real type
  assert _ran() == ["fedsim_fake_dp"] and other is fedsim_fake_dp.Annot
  assert module["probe"](fedsim_fake_dp.Other()) is True


def test_a_failing_package_raises_at_first_use_and_is_imported_afresh(fake):
  import fedsim_fake_broken
  with pytest.raises(RuntimeError, match="broken on purpose"):
    fedsim_fake_broken.anything  # pylint: disable=pointless-statement
  assert fake("fedsim_fake_broken") is None
  import fedsim_fake_broken as again
  assert again is not fedsim_fake_broken and _deferred("fedsim_fake_broken")


def test_a_first_use_inside_a_traced_function_runs_the_package_at_top_level(fake, tmp_path):
  tf = pytest.importorskip("tensorflow")
  (tmp_path / "fedsim_fake_tf.py").write_text("import tensorflow as tf\nSCALE = tf.constant(3.0)\n")
  lazy_imports.DEFERRED["fedsim_fake_tf"] = ("fake", frozenset())
  import fedsim_fake_tf

  @tf.function
  def scaled(x):
    return x * fedsim_fake_tf.SCALE  # the package runs here, while tracing

  assert float(scaled(tf.constant(2.0))) == 6.0
  assert float(fedsim_fake_tf.SCALE.numpy()) == 3.0  # an eager tensor, not the trace's


def test_the_cli_imports_no_heavy_package():
  heavy = ("tensorflow", "tensorflow_federated", "tensorflow_privacy", "dp_accounting",
           "tensorflow_probability", "sklearn", "scipy", "matplotlib", "pandas", "ray")
  code = f"import sys, fedsim.cli; print([m for m in {heavy!r} if m in sys.modules])"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_tff_imported_by_fedsim_defers_its_dp_packages_and_jax_until_first_used():
  code = textwrap.dedent("""
      import sys
      from fedsim.backend import lazy_imports, quiet
      tff = quiet.import_tff()
      deferred = lambda *names: [isinstance(sys.modules.get(n), lazy_imports._DeferredModule)
                                 for n in names]
      dp, jax = ("tensorflow_privacy", "dp_accounting"), ("jax", tff.jax.__name__)
      print(deferred(*dp), [n in sys.modules for n in ("tensorflow_probability", "scipy.stats")])
      from matplotlib import cbook  # asks each plotted value whether it is a JAX array
      print(cbook._unpack_to_numpy(1.5) == 1.5, deferred(*jax))
      factory = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
          noise_multiplier=1.0, clients_per_round=10, clip=1.0)
      import tensorflow_privacy
      print(deferred(*dp), factory._query.__class__ is tensorflow_privacy.NormalizedQuery)
      from tensorflow.lite.python import util  # binds jax.xla_computation at import
      print(deferred(*jax), "jaxlib" in sys.modules, callable(util._xla_computation))
      print(callable(tff.jax.computation), deferred(*jax), "jaxlib" in sys.modules)
      import gc
      print(gc.isenabled(), gc.get_freeze_count() > 100_000)  # the import's objects, frozen
      """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.splitlines()[-6:] == [
      "[True, True] [False, False]", "True [True, True]", "[False, False] True",
      "[True, True] False True", "True [False, False] True", "True True"]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_first_tff_import_runs_without_the_cyclic_gc_then_freezes(monkeypatch, enabled):
  import gc
  from fedsim.backend import quiet
  events = []
  monkeypatch.setattr(gc, "freeze", lambda: events.append(("freeze", gc.isenabled())))
  (gc.enable if enabled else gc.disable)()
  try:
    with quiet._without_cyclic_gc(True):  # pylint: disable=protected-access
      events.append(("inside", gc.isenabled()))
    with quiet._without_cyclic_gc(False):  # pylint: disable=protected-access
      events.append(("later import", gc.isenabled()))
    with pytest.raises(ImportError), quiet._without_cyclic_gc(True):  # pylint: disable=protected-access
      raise ImportError("no TFF")
    assert events == [("inside", False), ("freeze", enabled), ("later import", enabled)]
    assert gc.isenabled() == enabled
  finally:
    gc.enable()
