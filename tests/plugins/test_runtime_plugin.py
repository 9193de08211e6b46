"""A runtime added by a plugin file is used from YAML like the built-in ones, and
one that cannot run an algorithm falls back to `local` with a one-line notice."""

from __future__ import annotations

import pathlib
import shutil
import sys

import numpy as np
import pytest
import yaml

import fedsim

CONFIG = {
    "name": "toy", "seed": 2, "rounds": 2, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 6, "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": 0.3}},
}


@pytest.fixture
def config_dir(tmp_path):
  shutil.copy(__file__.replace("test_runtime_plugin.py", "toy_runtime.py"), tmp_path)
  yield tmp_path
  from fedsim.runtime.runtime_registry import RUNTIMES
  RUNTIMES._entries.pop("one_by_one", None)  # registries are process-wide
  for name in [m for m in sys.modules if "toy_runtime" in m]:
    del sys.modules[name]


def _write(config_dir, config) -> str:
  path = config_dir / "toy.yaml"
  path.write_text(yaml.safe_dump({**config, "plugins": ["toy_runtime.py"]}))
  return str(path)


@pytest.mark.slow
def test_a_plugin_runtime_runs_from_yaml_and_equals_inprocess(tff_runtime, config_dir, capsys):
  got = fedsim.run(_write(config_dir, {**CONFIG, "runtime": {"name": "one_by_one"}}),
                   logdir=config_dir / "runs", progress=False)
  module = next(m for n, m in sys.modules.items() if "toy_runtime" in n)
  assert module.CALLS == [3, 3]
  want = fedsim.run({**CONFIG, "runtime": {"name": "inprocess", "device": "cpu"}},
                    logdir=config_dir / "ref", progress=False)
  for g, w in zip(got.final_weights, want.final_weights, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
  assert "using local" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_buffered_algorithm_trains_its_clients_on_the_plugin_runtime(tff_runtime, config_dir):
  """FedBuff's dispatches and server updates are rounds of the plugin's too."""
  config = {**CONFIG, "rounds": 2, "algorithm": {"name": "fedbuff", "local_steps": 2}}
  got = fedsim.run(_write(config_dir, {**config, "runtime": {"name": "one_by_one"}}),
                   logdir=config_dir / "runs", progress=False)
  module = next(m for n, m in sys.modules.items() if "toy_runtime" in n)
  # Three dispatched, three server updates of K = 3 arrivals, three dispatched...
  assert module.CALLS == [3, 3, 3, 3]
  want = fedsim.run({**config, "runtime": {"name": "inprocess", "device": "cpu"}},
                    logdir=config_dir / "ref", progress=False)
  for g, w in zip(got.final_weights, want.final_weights, strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_the_plugin_guide_shows_this_runtime_file():
  from tests.docs.markdown_blocks import DOCS, blocks
  shown = [b.code for b in blocks(DOCS / "guides" / "plugins.md") if b.file == "my_runtime.py"]
  assert shown == [pathlib.Path(__file__).with_name("toy_runtime.py").read_text()]


@pytest.mark.slow
def test_a_runtime_that_cannot_run_the_algorithm_falls_back_in_one_line(
    tff_runtime, config_dir, capsys):
  config = {**CONFIG, "rounds": 1, "algorithm": {"name": "scaffold"},
            "runtime": {"name": "one_by_one"}}
  fedsim.run(_write(config_dir, config), logdir=config_dir / "runs", progress=False)
  err = capsys.readouterr().err
  assert err.count("fedsim: runtime.name: one_by_one cannot run this algorithm (one_by_one"
                   " keeps no client states); using local\n") == 1


def test_the_plugin_runtime_is_listed_with_its_keys(config_dir, capsys):
  from fedsim import cli
  assert cli.main(["validate", _write(config_dir, {**CONFIG, "runtime": {
      "name": "one_by_one", "device": "cpu"}})]) == 0
  assert cli.main(["list", "runtime", "--plugin", str(config_dir / "toy_runtime.py")]) == 0
  out = capsys.readouterr().out
  assert "one_by_one" in out and "device: cpu|gpu|auto = cpu" in out
  assert "client_state_memory_mb" in out


def test_unknown_keys_of_a_plugin_runtime_are_refused_by_name(config_dir, capsys):
  from fedsim import cli
  path = _write(config_dir, {**CONFIG, "runtime": {"name": "one_by_one", "workers": 5}})
  assert cli.main(["validate", path]) == 2
  assert "runtime.workers: unknown key" in capsys.readouterr().err
