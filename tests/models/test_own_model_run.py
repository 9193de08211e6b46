"""A run with the user's own Keras model, end to end: it starts from
`model.initial_weights`, and its final_model.npz loads into the same Keras model
and reproduces the run's evaluation (dropout off, the final softmax once)."""

from __future__ import annotations

import numpy as np
import pytest

import fedsim
from fedsim.config.typed import Component, parse
from fedsim.data import DATASETS
from fedsim.models import MODELS
from fedsim.models.functional import build_task_model
from fedsim.state.model_export import export_model
from tests.models import keras_builders

ARGS = {"hidden": 16, "dropout": 0.3, "softmax": "dense"}
DATA = {"name": "digits", "num_clients": 6, "partition": "iid", "batch_size": 16}
MODEL = {"name": "keras", "builder": "tests.models.keras_builders:dense", "args": ARGS}


@pytest.mark.slow
def test_own_model_starts_from_file_and_exports_for_keras(tff_runtime, tmp_path):
  # Initial weights from another seed than the run's, so the file must be read.
  start = build_task_model(
      Component("keras", parse(MODELS.get("keras").params,
                               {k: v for k, v in MODEL.items() if k != "name"}, "model")),
      (64,), 10, seed=5)
  initial = tmp_path / "start.npz"
  export_model(initial, start.initial_weights, start.weight_names)
  # A negligible server step: the run's model stays at the file's weights.
  config = {
      "name": "own_model", "seed": 0, "rounds": 1, "clients_per_round": 3, "data": DATA,
      "model": dict(MODEL, initial_weights=str(initial)),
      "algorithm": {"name": "fedavg", "server_optimizer": {"name": "sgd", "learning_rate": 1e-9}},
  }
  result = fedsim.run(config, logdir=tmp_path)
  with np.load(result.run_dir / "final_model.npz") as f:
    keys, arrays = f.files, [f[k] for k in f.files]
  assert [k.split("/")[-1] for k in keys] == ["kernel", "bias", "kernel", "bias"]
  for got, want in zip(arrays, start.initial_weights.trainable):
    np.testing.assert_allclose(got, want, atol=1e-6)

  # docs/guides/own-model.md's recipe: the builder's own Keras model (softmax and dropout
  # included) takes the file and, in inference mode, reproduces the evaluation.
  test = DATASETS.get("digits").build(parse(DATASETS.get("digits").params,
                                            {k: v for k, v in DATA.items() if k != "name"},
                                            "data"), 0).test
  keras = keras_builders.dense((64,), 10, **ARGS)
  keras.set_weights(arrays)
  p = keras(test.x, training=False).numpy().astype(np.float64)
  final = result.metrics[-1]
  assert final["eval/accuracy"] == pytest.approx(np.mean(p.argmax(1) == test.y))
  assert final["eval/loss"] == pytest.approx(-np.log(p[np.arange(len(test.y)), test.y]).mean(),
                                             rel=1e-5)
