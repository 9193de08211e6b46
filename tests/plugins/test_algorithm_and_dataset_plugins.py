"""An algorithm and a dataset, each one plugin file, used from YAML together: the
algorithm equals FedAvg at zero decay, shrinks the weights with decay, and gets
error feedback from the config without opting in; the dataset is seeded."""

from __future__ import annotations

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
    "plugins": ["toy_dataset.py", "toy_algorithm.py"],
    "data": {"name": "blobs", "num_clients": 6, "batch_size": 8},
    "model": {"name": "logistic"},
}
SGD = {"name": "sgd", "learning_rate": 0.2}


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("plugins")
  for name in ("toy_dataset.py", "toy_algorithm.py"):
    shutil.copy(HERE / name, path)
  yield path
  from fedsim.algorithms import ALGORITHMS
  from fedsim.data import DATASETS
  ALGORITHMS._entries.pop("fedavg_decay", None)  # registries are process-wide
  DATASETS._entries.pop("blobs", None)
  for name in [m for m in sys.modules if "toy_dataset" in m or "toy_algorithm" in m]:
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
