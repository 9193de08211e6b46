"""The plugin example of docs/guides/plugins.md, as a user runs it: one plugin file next to a
config registers a Keras model, an encoder and a TFF aggregation stage."""

from __future__ import annotations

import csv
import pathlib
import shutil

import pytest

from tests.e2e.test_cli import fedsim

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "plugin_example"
CONFIG = EXAMPLE / "lab_example.yaml"


def test_the_example_validates():
  out = fedsim("validate", str(CONFIG))
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == f"{CONFIG}: ok (1 run: lab_example)"


@pytest.mark.parametrize("override,message", [
    ("model.name=dropout_mlpp",
     "model.name: unknown model 'dropout_mlpp' (did you mean 'dropout_mlp'?)"),
    ("aggregation=[{name: l1_zeroing, max_norm: 10}, {name: encode,"
     " encoder: uniform_nearst}]",
     "aggregation[1].encoder: unknown encoder 'uniform_nearst' (did you mean"
     " 'uniform_nearest'?)"),
    ("aggregation=[{name: l1_zeroin, max_norm: 10}]",
     "aggregation[0].name: unknown aggregation stage 'l1_zeroin' (did you mean 'l1_zeroing'?)"),
    ("aggregation=[{name: l1_zeroing, max_nrom: 10}]",
     "aggregation[0].max_nrom: unknown key (did you mean 'max_norm'?)"),
])
def test_validate_names_a_typo_in_each_plugin_piece(override, message):
  out = fedsim("validate", str(CONFIG), "--set", override)
  assert out.returncode == 2
  assert out.stderr.startswith(f"fedsim: error: {message}"), out.stderr
  assert len(out.stderr.strip().splitlines()) == 1


def test_a_batch_norm_model_is_refused_naming_the_layer(tmp_path):
  plugin = tmp_path / "bn_plugin.py"
  plugin.write_text(
      "from fedsim.models import register_model\n"
      "@register_model('bn_mlp')\n"
      "def bn_mlp(params, input_shape, num_classes):\n"
      "  import tensorflow as tf\n"
      "  return tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=input_shape),\n"
      "      tf.keras.layers.Dense(8), tf.keras.layers.BatchNormalization(name='bn'),\n"
      "      tf.keras.layers.Dense(num_classes)])\n")
  config = tmp_path / "bn.yaml"
  config.write_text(CONFIG.read_text().replace("[./lab_plugin.py]", "[./bn_plugin.py]")
                    .replace("model: {name: dropout_mlp, width: 64, dropout: 0.2}",
                             "model: {name: bn_mlp}")
                    .replace("encoder: uniform_nearest", "encoder: uniform")
                    .replace("- {name: l1_zeroing, max_norm: 1000.0}\n", ""))
  out = fedsim("run", str(config), "--set", "rounds=1", "--logdir", str(tmp_path / "runs"))
  assert out.returncode == 2, out.stderr
  assert "'bn'" in out.stderr and "non-trainable" in out.stderr
  assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.slow
def test_the_example_runs_with_all_three_plugin_pieces(tmp_path):
  for name in ("lab_plugin.py", "lab_example.yaml"):
    shutil.copy(EXAMPLE / name, tmp_path / name)
  out = fedsim("run", str(tmp_path / "lab_example.yaml"), "--set", "rounds=2",
               "--set", "runtime.name=inprocess", "--logdir", str(tmp_path / "runs"),
               cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  run_dir = next(p for p in (tmp_path / "runs" / "lab_example").iterdir()
                 if (p / "config.yaml").is_file())
  rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
  assert len(rows) == 2 and float(rows[-1]["eval/accuracy"]) > 0.1
  assert float(rows[-1]["aggregation/l1_zeroing/zeroed_count"]) == 0
  assert "aggregation/l1_zeroing/zeroing_norm" in rows[-1]
  # Only the first kernel (64 x 64 = 4,096 of 4,810 weights) has min_elements 1000:
  # at 8 bits (packed 28 to an int32) the update is well under half its float32 size.
  uncompressed = int(rows[-1]["broadcast_model_bits_per_client"])
  assert int(rows[-1]["aggregate_model_bits_per_client"]) < uncompressed / 2
  assert (run_dir / "status").read_text().startswith("completed")
