"""Plugins: user modules and .py files whose registrations a config can name (no TF)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import yaml

from fedsim import cli
from fedsim.experiment.config.loader import expand_variants, load_config
from fedsim.errors import UserError
from fedsim.models import MODELS
from fedsim.plugins import load_plugins, module_name

PLUGIN = '''
import dataclasses
from fedsim.models import MODELS

@dataclasses.dataclass(frozen=True)
class WideParams:
  width: int = 3

@MODELS.register("{name}", params=WideParams)
def build(params, input_shape, num_classes):
  """A model that only this test knows."""
  raise AssertionError("not built by a validation")
'''


@pytest.fixture(autouse=True)
def forget_test_models(monkeypatch):
  """Drops the models a test's plugins register (registries are process-wide)."""
  monkeypatch.setattr(sys, "path", list(sys.path))  # module plugins extend it
  before = dict(MODELS._entries)
  yield
  MODELS._entries.clear()
  MODELS._entries.update(before)


def _config(name: str, model: str, **extra) -> dict:
  return {"name": name, "rounds": 1, "clients_per_round": 1, "model": model,
          "data": {"name": "digits", "num_clients": 2}, **extra}


def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  return path


def test_file_plugin_is_relative_to_the_config_and_usable_everywhere(tmp_path, monkeypatch):
  monkeypatch.chdir("/")  # relative to the config's directory, not the working directory
  _write(tmp_path / "exp" / "my_plugin.py", PLUGIN.format(name="plugin_file_model"))
  config = _write(tmp_path / "exp" / "c.yaml", yaml.safe_dump(_config(
      "p", {"name": "plugin_file_model", "width": 5}, plugins=["./my_plugin.py"],
      variants={"wider": {"model": {"width": 7}}, "mlp": {"model": "mlp"}})))
  typed, raw = load_config(config, ["model.width=6"])
  assert (typed.model.name, typed.model.params.width) == ("plugin_file_model", 6)
  runs = dict(expand_variants(raw))
  assert runs["wider"].model.params.width == 7 and runs["mlp"].model.name == "mlp"
  # Recorded as imported, so a run's config.yaml names the file from anywhere.
  assert typed.plugins == [str((tmp_path / "exp" / "my_plugin.py").resolve())]
  # Loading the config again reuses the module: nothing registers twice.
  module = sys.modules[module_name((tmp_path / "exp" / "my_plugin.py").resolve())]
  load_config(config)
  assert sys.modules[module_name((tmp_path / "exp" / "my_plugin.py").resolve())] is module


def test_module_plugin_imports_from_the_config_directory(tmp_path, monkeypatch):
  monkeypatch.chdir("/")
  _write(tmp_path / "lab_pkg_a" / "__init__.py", "")
  _write(tmp_path / "lab_pkg_a" / "models.py", PLUGIN.format(name="plugin_module_model"))
  config = _write(tmp_path / "c.yaml", yaml.safe_dump(_config(
      "p", "plugin_module_model", plugins=["lab_pkg_a.models"])))
  try:
    typed, _ = load_config(config)
  finally:
    for name in ("lab_pkg_a", "lab_pkg_a.models"):
      sys.modules.pop(name, None)
  assert typed.model.name == "plugin_module_model"


def test_mapping_config_plugins_are_relative_to_cwd(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  _write(tmp_path / "p.py", PLUGIN.format(name="plugin_cwd_model"))
  typed, _ = load_config(_config("p", "plugin_cwd_model", plugins=["p.py"]))
  assert typed.model.name == "plugin_cwd_model"


def test_unknown_name_without_the_plugin():
  with pytest.raises(UserError, match="model.name: unknown model 'plugin_never_model'"):
    load_config(_config("p", "plugin_never_model"))


@pytest.mark.parametrize("spec,source,expected", [
    ("./broken.py", "import foo_missing_for_test\n",
     "plugins[0]: ./broken.py: ModuleNotFoundError: No module named 'foo_missing_for_test'"),
    ("./raises.py", "raise RuntimeError('bad\\nnews')\n",
     "plugins[0]: ./raises.py: RuntimeError: bad news"),
    ("./absent.py", None, "plugins[0]: ./absent.py: file not found"),
    ("no_such_module_for_test", None,
     "plugins[0]: no_such_module_for_test: ModuleNotFoundError: No module named"
     " 'no_such_module_for_test'"),
    ("not a module", None, "plugins[0]: not a module: not a module name"),
])
def test_failing_plugin_is_one_line(tmp_path, spec, source, expected):
  if source is not None:
    _write(tmp_path / spec, source)
  config = _write(tmp_path / "c.yaml", yaml.safe_dump(_config("p", "mlp", plugins=[spec])))
  with pytest.raises(UserError) as e:
    load_config(config)
  assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_a_plugin_path_that_is_a_directory_is_called_one(tmp_path, capsys):
  from fedsim import cli
  (tmp_path / "myplugins").mkdir()
  config = _write(tmp_path / "c.yaml",
                  yaml.safe_dump(_config("p", "mlp", plugins=["./myplugins/"])))
  with pytest.raises(UserError, match=rf"^plugins\[0\]: ./myplugins/: {tmp_path}/myplugins is a"
                                      r" directory; name a .py file in it, or the package as a"
                                      r" module \(its directory on PYTHONPATH\)$"):
    load_config(config)
  assert cli.main(["list", "model", "--plugin", str(tmp_path / "myplugins")]) == 2
  assert capsys.readouterr().err == (
      f"fedsim: error: --plugin {tmp_path / 'myplugins'}: {tmp_path}/myplugins is a directory;"
      " name a .py file in it, or the package as a module (its directory on PYTHONPATH)\n")


def test_plugins_must_be_a_list_and_not_per_variant(tmp_path):
  with pytest.raises(UserError, match=r"^plugins: expected a list of module names"):
    load_config(_config("p", "mlp", plugins="./x.py"))
  with pytest.raises(UserError, match=r"^variants.v: a variant may not set 'plugins'"):
    load_config(_config("p", "mlp", variants={"v": {"plugins": ["x"]}}))


def test_a_second_function_under_a_taken_name_is_refused(tmp_path):
  source = PLUGIN.format(name="plugin_twice_model")
  load_plugins(["./a.py"], _write(tmp_path / "a.py", source).parent)
  _write(tmp_path / "b.py", source)
  with pytest.raises(UserError, match=r"^plugins\[0\]: ./b.py: ValueError: model"
                                      r" 'plugin_twice_model' is already registered$"):
    load_plugins(["./b.py"], tmp_path)


def test_cli_plugin_flag_and_failure(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  _write(tmp_path / "plugs" / "flag.py", PLUGIN.format(name="plugin_flag_model"))
  config = _write(tmp_path / "c.yaml", yaml.safe_dump(_config("p", "plugin_flag_model")))
  assert cli.main(["validate", str(config), "--plugin", "plugs/flag.py"]) == 0
  assert capsys.readouterr().out.startswith(f"{config}: ok (1 run: p)")
  _write(tmp_path / "bad.py", "import foo_missing_for_test\n")
  assert cli.main(["validate", str(config), "--plugin", "./bad.py"]) == 2
  assert capsys.readouterr().err == (
      "fedsim: error: --plugin ./bad.py: ModuleNotFoundError: No module named"
      " 'foo_missing_for_test'\n")


def _readme_example(tmp_path):
  """Writes the documentation's example plugin and config (docs/guides/plugins.md,
  once README's "Extending fedsim") into tmp_path."""
  section = (pathlib.Path(__file__).parents[2] / "docs" / "guides" / "plugins.md").read_text()
  code = section.split("```python\n", 1)[1].split("```", 1)[0]
  config = section.split("```yaml\nname: blobs", 1)[1].split("```", 1)[0]
  _write(tmp_path / "my_plugin.py", code)
  return _write(tmp_path / "blobs.yaml", "name: blobs" + config)


def test_readme_plugin_example_validates_and_builds_its_data(tmp_path):
  from fedsim.data import DATASETS
  from fedsim.describe_data import describe
  before = dict(DATASETS._entries)
  try:
    config = _readme_example(tmp_path)
    text = describe(config, ["data.num_clients=5"])
  finally:
    DATASETS._entries.clear()
    DATASETS._entries.update(before)
  assert text.splitlines()[:4] == [
      "dataset: blobs (seed 0)", "clients: 5", "examples: 300 on clients, 500 held out",
      "input shape: [2], dtype float32; classes: 2"]


@pytest.mark.slow
# `-m long` (~25 s, a `fedsim run` process): the example's data is built by the
# test above, and plugins/test_algorithm_and_dataset_plugins.py trains a plugin
# dataset from YAML in every run.
@pytest.mark.long
def test_readme_plugin_example_trains(tmp_path):
  config = _readme_example(tmp_path)
  result = subprocess.run(
      [sys.executable, "-m", "fedsim.cli", "run", str(config), "--set", "rounds=2",
       "--logdir", str(tmp_path / "runs"), "--no-progress"],
      cwd="/", stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr
  assert "rounds: 2, final eval/accuracy" in result.stdout
