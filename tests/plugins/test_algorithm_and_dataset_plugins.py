"""Plugins of each kind, each one file, used from YAML together: the algorithm
equals FedAvg at zero decay, shrinks the weights with decay, and gets error
feedback from the config without opting in; the dataset is seeded; the encoder's
upload is sized at its packing formula and decodes to its grid; the stateful
algorithm equals FedAvg at beta 0 and keeps each client's momentum on disk. The
plugin guide shows the encoder, stateful algorithm, runtime and controller files
verbatim."""

from __future__ import annotations

import math
import pathlib
import shutil
import sys

import numpy as np
import pytest
import yaml

import fedsim

HERE = pathlib.Path(__file__).parent
CONFIG = {
    "name": "plugins", "seed": 3, "rounds": 2, "clients_per_round": 3,
    "plugins": ["toy_dataset.py", "toy_algorithm.py", "toy_encoder.py",
                "toy_stateful_algorithm.py"],
    "data": {"name": "blobs", "num_clients": 6, "batch_size": 8},
    "model": {"name": "logistic"},
}
SGD = {"name": "sgd", "learning_rate": 0.2}


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("plugins")
  for name in CONFIG["plugins"]:
    shutil.copy(HERE / name, path)
  yield path
  from fedsim.algorithms import ALGORITHMS
  from fedsim.compression import ENCODERS
  from fedsim.data import DATASETS
  ALGORITHMS._entries.pop("fedavg_decay", None)  # registries are process-wide
  ALGORITHMS._entries.pop("client_momentum", None)
  ENCODERS._entries.pop("fixed_grid", None)
  DATASETS._entries.pop("blobs", None)
  for name in [m for m in sys.modules
               if any(p.removesuffix(".py") in m for p in CONFIG["plugins"])]:
    del sys.modules[name]


def _run(config_dir, name, **changes):
  path = config_dir / f"{name}.yaml"
  path.write_text(yaml.safe_dump({**CONFIG, "name": name, **changes}))
  return fedsim.run(str(path), logdir=config_dir / "runs", progress=False)


@pytest.mark.slow
def test_plugin_algorithm_and_dataset_run_from_yaml(tff_runtime, config_dir):
  plain = _run(config_dir, "fedavg", algorithm={"name": "fedavg", "client_optimizer": SGD})
  zero = _run(config_dir, "zero", algorithm={"name": "fedavg_decay", "decay": 0.0,
                                             "client_optimizer": SGD})
  for a, b in zip(zero.final_weights, plain.final_weights, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # decay 0 is FedAvg
  decayed = _run(config_dir, "decayed", algorithm={"name": "fedavg_decay", "decay": 0.5,
                                                   "client_optimizer": SGD})
  assert (np.linalg.norm(decayed.final_weights[0])
          < np.linalg.norm(plain.final_weights[0]))
  # The plugin's upload is a model delta: error feedback applies from the config.
  ef = _run(config_dir, "ef", algorithm={"name": "fedavg_decay", "client_optimizer": SGD},
            aggregation=[{"name": "encode", "encoder": "topk", "k": 3, "min_elements": 10,
                          "error_feedback": True}])
  assert all(m["error_feedback/residual_norm"] > 0 for m in ef.metrics)
  assert len(list((ef.run_dir / "client_states").glob("*.npz"))) >= 3


def test_the_plugin_dataset_is_seeded_and_listed(config_dir, capsys):
  from fedsim import cli
  from fedsim.plugins import load_plugins
  load_plugins(["toy_dataset.py"], config_dir)
  from fedsim.data import DATASETS
  from fedsim.config.typed import parse
  entry = DATASETS.get("blobs")
  params = parse(entry.params, {"num_clients": 4})
  a, b = entry.build(params, 7), entry.build(params, 7)
  assert len(a.client_ids) == 4
  np.testing.assert_array_equal(a.test.x, b.test.x)
  assert cli.main(["list", "dataset", "--plugin", str(config_dir / "toy_dataset.py")]) == 0
  assert "dataset blobs" in capsys.readouterr().out


@pytest.mark.slow
def test_the_plugin_encoder_runs_from_yaml_at_its_packed_size(tff_runtime, config_dir):
  bits, limit = 3, 0.5
  stage = {"name": "encode", "encoder": "fixed_grid", "bits": bits, "limit": limit,
           "min_elements": 0}
  run = _run(config_dir, "grid", aggregation=[stage],
             algorithm={"name": "fedavg", "client_optimizer": SGD,
                        "server_optimizer": {"name": "sgd", "learning_rate": 1.0}})
  # Every tensor encoded: ceil(n * bits / 28) int32 words of packed indices, nothing else.
  model_bits = sum(math.ceil(w.size * bits / 28) * 32 for w in run.final_weights)
  assert [m["aggregate_model_bits_per_client"] for m in run.metrics] == [model_bits] * 2


def test_the_plugin_encoder_decodes_to_the_nearest_grid_point(config_dir):
  import tensorflow as tf
  from fedsim.compression import ENCODERS, tensor_encoding_api as te
  from fedsim.plugins import load_plugins
  load_plugins(["toy_encoder.py"], config_dir)
  entry = ENCODERS.get("fixed_grid")
  x = np.array([-2.0, -0.5, -0.2, -0.05, 0.07, 0.3, 0.5, 0.9], np.float32)
  encoder = te.simple_encoder(entry.build(entry.params(bits=2, limit=0.6)),
                              tf.TensorSpec(x.shape, tf.float32))
  encoded, _ = encoder.encode(tf.constant(x), encoder.initial_state())
  # Grid of 2**2 points on [-0.6, 0.6]: -0.6, -0.2, 0.2, 0.6; clipped first, then nearest.
  want = np.array([-0.6, -0.6, -0.2, -0.2, 0.2, 0.2, 0.6, 0.6], np.float32)
  np.testing.assert_allclose(encoder.decode(encoded), want, atol=1e-6)


@pytest.mark.slow
def test_the_plugin_stateful_algorithm_runs_from_yaml_and_keeps_client_state(
    tff_runtime, config_dir):
  momentum = {"name": "client_momentum", "beta": 0.5, "client_optimizer": SGD}
  fedavg = {"name": "fedavg", "client_optimizer": SGD}
  # Round 1: every client is new, its momentum zero, so it sends FedAvg's update.
  first = _run(config_dir, "momentum1", algorithm=momentum, rounds=1)
  plain = _run(config_dir, "fedavg1", algorithm=fedavg, rounds=1)
  for a, b in zip(first.final_weights, plain.final_weights, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  # 3 of 6 clients a round for three rounds: some client comes back with its momentum.
  kept = _run(config_dir, "momentum3", algorithm=momentum, rounds=3)
  assert len(list((kept.run_dir / "client_states").glob("*.npz"))) >= 3
  plain = _run(config_dir, "fedavg3", algorithm=fedavg, rounds=3)
  assert not np.allclose(kept.final_weights[0], plain.final_weights[0], rtol=1e-3)


@pytest.mark.parametrize("shown,file", [
    ("my_encoder.py", "toy_encoder.py"),
    ("my_stateful_algorithm.py", "toy_stateful_algorithm.py"),
    ("loss_halving.py", "toy_controller.py"),
])
def test_the_plugin_guide_shows_each_plugin_file(shown, file):
  """(The runtime's: `test_runtime_plugin.py`.)"""
  from tests.docs.markdown_blocks import DOCS, blocks
  codes = [b.code for b in blocks(DOCS / "guides" / "plugins.md") if b.file == shown]
  assert codes == [(HERE / file).read_text()]
