"""`fedsim validate` checks files, builders and the GPU of this machine, without TF."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from fedsim import api
from fedsim.experiment.config import environment
from fedsim.errors import UserError

BASE = {"name": "env", "rounds": 1, "clients_per_round": 1, "model": "mlp",
        "data": {"name": "digits", "num_clients": 2}}


def _emnist(cache_dir) -> dict:
  return {**BASE, "data": {"name": "emnist", "cache_dir": str(cache_dir)}}


def test_missing_dataset_file_names_the_path(tmp_path):
  with pytest.raises(UserError) as e:
    api.validate(_emnist(tmp_path))
  assert str(e.value).startswith(
      f"data.cache_dir: {tmp_path / 'emnist_all.sqlite'} not found (fedsim never downloads)")
  (tmp_path / "emnist_all.sqlite").write_bytes(b"SQLite format 3\x00")
  names = api.validate(_emnist(tmp_path))
  assert names == ["env"]
  assert names.not_checked == [
      f"not checked: the contents of {tmp_path / 'emnist_all.sqlite'} (read when a run opens it)"]


@pytest.fixture
def builders(tmp_path, monkeypatch):
  """A module `env_builders_mod` on sys.path with `load`; and one that raises on import."""
  (tmp_path / "env_builders_mod.py").write_text("def load(seed):\n  return {}\n")
  (tmp_path / "env_raising_mod.py").write_text("raise RuntimeError('no\\nluck')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  yield
  for name in ("env_builders_mod", "env_raising_mod"):
    sys.modules.pop(name, None)


@pytest.mark.parametrize("builder,expected", [
    ("env_missing_mod:load", "data.builder: cannot import module 'env_missing_mod'"
                             " (No module named 'env_missing_mod')"),
    ("env_builders_mod:lode", "data.builder: module 'env_builders_mod' has no function 'lode'"),
    ("env_raising_mod:load", "data.builder: importing 'env_raising_mod' raised RuntimeError:"
                             " no luck"),
])
def test_builder_must_import(builders, builder, expected):
  with pytest.raises(UserError) as e:
    api.validate({**BASE, "data": {"name": "custom", "builder": builder}})
  assert str(e.value) == expected


def test_importable_builder_is_noted(builders):
  names = api.validate({**BASE, "data": {"name": "custom", "builder": "env_builders_mod:load"}})
  assert names.not_checked == [
      "not checked: what data.builder env_builders_mod:load returns (it runs in a run)"]


@pytest.fixture
def no_nvidia_smi(monkeypatch):
  real = shutil.which
  monkeypatch.setattr(shutil, "which", lambda name: None if name == "nvidia-smi" else real(name))


def test_gpu_without_a_driver_is_an_error(tmp_path, monkeypatch, no_nvidia_smi):
  monkeypatch.setattr(environment, "NVIDIA_GPUS", str(tmp_path / "gpus"))
  config = {**BASE, "runtime": {"name": "inprocess", "device": "gpu"}}
  with pytest.raises(UserError, match=r"^runtime.device: gpu, but this machine shows no GPU"):
    api.validate(config)
  assert api.validate({**config, "runtime": {"name": "inprocess", "device": "auto"}}) == ["env"]
  (tmp_path / "gpus" / "0000:00:1e.0").mkdir(parents=True)
  assert api.validate(config).not_checked == [
      "not checked: that TensorFlow can use the GPU (runtime.device: gpu; its CUDA libraries"
      " load in a run)"]


def test_errors_name_the_variant_only_when_it_matters(tmp_path):
  good, bad = tmp_path / "good", tmp_path / "bad"
  good.mkdir()
  (good / "emnist_all.sqlite").write_bytes(b"SQLite format 3\x00")
  config = {**_emnist(good), "variants": {"a": {}, "b": {"data": {"cache_dir": str(bad)}}}}
  with pytest.raises(UserError, match=r"^variants.b: data.cache_dir: "):
    api.validate(config)
  assert api.validate(config, variant="a") == ["a"]
  with pytest.raises(UserError, match=r"^data.cache_dir: "):
    api.validate({**_emnist(bad), "variants": {"a": {}, "b": {"rounds": 2}}})


@pytest.mark.parametrize("data, said", [
    ({"name": "digits", "num_clients": 2000},
     "data.num_clients: 2000 clients need at least 2000 examples, digits has 1437 for training"),
    ({"name": "digits", "num_clients": 100, "min_examples_per_client": 20},
     "data.min_examples_per_client: 100 clients x 20 examples need 2000, digits has 1437 for"
     " training"),
    ({"name": "digits", "num_clients": 1437}, None),   # one example each: it fits
])
def test_data_that_builds_quickly_is_built_and_what_it_cannot_meet_is_refused(data, said):
  """As a run refuses it once its data is loaded (validate said ok)."""
  config = {**BASE, "data": data}
  if said is None:
    assert api.validate(config) == ["env"]
    return
  with pytest.raises(UserError) as validated:
    api.validate(config)
  assert str(validated.value) == said
  from fedsim.experiment.config.loader import load_config
  from fedsim.experiment.population import training_data
  with pytest.raises(UserError) as built:   # what the run's build says
    training_data(load_config(config)[0])
  assert str(built.value) == said
  with pytest.raises(UserError) as in_a_variant:
    api.validate({**BASE, "variants": {"small": {}, "big": {"data": data}}})
  assert str(in_a_variant.value) == f"variants.big: {said}"


def test_cli_prints_what_it_could_not_check_without_importing_tensorflow(tmp_path):
  (tmp_path / "emnist_all.sqlite").write_bytes(b"SQLite format 3\x00")
  (tmp_path / "c.yaml").write_text(
      f"name: env\nrounds: 1\nclients_per_round: 1\nmodel: cnn\n"
      f"data: {{name: emnist, cache_dir: '{tmp_path}'}}\n")
  (tmp_path / "d.yaml").write_text("name: env\nrounds: 1\nclients_per_round: 1\nmodel: mlp\n"
                                   "data: {name: digits, num_clients: 3}\n")
  code = ("import sys\nfrom fedsim import cli\nassert cli.main(['validate', 'd.yaml']) == 0\n"
          "code = cli.main(['validate', 'c.yaml'])\n"
          "assert not [m for m in sys.modules if m.split('.')[0] in"
          " ('tensorflow', 'tensorflow_federated', 'keras')], 'TF imported'\nsys.exit(code)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [
      "d.yaml: ok (1 run: env)",
      "c.yaml: ok (1 run: env)",
      f"not checked: the contents of {tmp_path / 'emnist_all.sqlite'} (read when a run opens it)"]
