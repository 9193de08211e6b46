"""A plugin file named under `plugins:` and by a `builder:` path is one module,
and a builder's import error ends `fedsim run` in one line, exit 2 (as `validate`)."""

from __future__ import annotations

import pytest

from tests.e2e.test_cli import fedsim

# Registers a model (a second run of this file would fail: 'already registered')
# and builds the data the config names by import path.
LAB = '''
import numpy as np
from fedsim.models import register_model

@register_model("lab_linear")
def lab_linear(params, input_shape, num_classes):
  import tensorflow as tf
  return tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=input_shape),
                              tf.keras.layers.Dense(num_classes)])

def blobs(seed):
  rng = np.random.default_rng(seed)
  def part(n):
    y = rng.integers(0, 2, n)
    return (rng.normal(size=(n, 2)) + 3 * y[:, None]).astype("float32"), y
  return {"clients": {f"c{i}": part(20) for i in range(4)}, "test": part(40)}
'''

CONFIG = """
name: lab
rounds: 1
clients_per_round: 2
plugins: [./lab.py]
data: {{name: custom, builder: "{builder}", batch_size: 10}}
model: {{name: lab_linear}}
"""


@pytest.mark.slow
def test_a_plugin_named_twice_is_imported_once(tmp_path):
  (tmp_path / "lab.py").write_text(LAB)
  (tmp_path / "lab.yaml").write_text(CONFIG.format(builder="lab:blobs"))
  for command in (["validate", "lab.yaml"],
                  ["run", "lab.yaml", "--logdir", "runs", "--no-progress"]):
    result = fedsim(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
  assert "rounds: 1, final eval/accuracy" in result.stdout


@pytest.mark.parametrize("command", [["validate"], ["run", "--logdir", "runs"]])
def test_a_builder_that_fails_to_import_is_one_line_exit_2(tmp_path, command):
  (tmp_path / "lab.py").write_text(LAB)
  (tmp_path / "broken.py").write_text("raise RuntimeError('no\\nsensors')\n")
  (tmp_path / "lab.yaml").write_text(CONFIG.format(builder="broken:load"))
  result = fedsim(command[0], "lab.yaml", *command[1:], cwd=tmp_path)
  assert result.returncode == 2
  assert result.stderr.splitlines() == [
      "fedsim: error: data.builder: importing 'broken' raised RuntimeError: no sensors"]
