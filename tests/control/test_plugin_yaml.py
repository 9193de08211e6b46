"""The plugin controller of tests/plugins/toy_controller.py, named from YAML: each
round's upload is sized at the bits its rule gives from the run's own training
losses (recomputed here by hand), each equal to a run with those bits fixed."""

from __future__ import annotations

import math
import shutil
import sys

import pytest
import yaml

import fedsim
from tests.control.test_plugin_controller import PLUGIN

CONFIG = {
    "seed": 2, "rounds": 6, "clients_per_round": 3, "plugins": [PLUGIN.name],
    "data": {"name": "digits", "num_clients": 6, "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": 0.3}},
}
CONTROLLED = {"controller": "loss_halving", "initial": 2, "max": 8, "per_halving": 2}


@pytest.fixture
def config_dir(tmp_path):
  shutil.copy(PLUGIN, tmp_path)
  yield tmp_path
  from fedsim.control import CONTROLLERS
  CONTROLLERS._entries.pop("loss_halving", None)  # registries are process-wide
  for name in [m for m in sys.modules if "toy_controller" in m]:
    del sys.modules[name]


def _run(config_dir, name, bits, **changes):
  path = config_dir / f"{name}.yaml"
  stage = {"name": "encode", "encoder": "uniform", "bits": bits, "min_elements": 10}
  path.write_text(yaml.safe_dump({**CONFIG, "name": name, "aggregation": [stage], **changes}))
  return fedsim.run(str(path), logdir=config_dir / "runs", progress=False)


@pytest.mark.slow
def test_a_plugin_controller_sets_each_rounds_bits_from_yaml(tff_runtime, config_dir):
  run = _run(config_dir, "halving", CONTROLLED)
  losses = [row["train/loss"] for row in run.metrics]
  # The rule by hand: 2 + 2 * floor(log2(F_1 / F_{r-1})) within [1, 8]; round 1 at 2.
  want = [2] + [min(8, max(1, 2 + 2 * math.floor(math.log2(losses[0] / f))))
                for f in losses[:-1]]
  assert len(set(want)) > 1, f"the loss never halved: {losses}"
  sent = [row["aggregate_bits_per_client_mean"] for row in run.metrics]
  for bits in sorted(set(want)):
    fixed = _run(config_dir, f"fixed{bits}", bits, rounds=1)
    per_client = fixed.metrics[0]["aggregate_bits_per_client_mean"]
    assert [s for s, b in zip(sent, want) if b == bits] == [per_client] * want.count(bits)
  assert sent[-1] > sent[0]  # more bits, a bigger upload
