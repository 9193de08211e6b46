"""TensorBoard outputs, read back from the event files (imports TensorFlow)."""

from __future__ import annotations

import pytest
import yaml
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

from fedsim.reporting.hparams import flat_hparams, write_hparams
from fedsim.reporting.sinks import CompositeSink, CsvSink, TensorBoardSink, read_metrics_csv


def _load(path):
  acc = event_accumulator.EventAccumulator(
      str(path), size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  return acc


def _scalars(acc):
  return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
          for tag in acc.Tags()["tensors"] if not tag.startswith("_hparams_")}


def test_scalars_use_metric_names_and_round_steps(tmp_path):
  sink = TensorBoardSink(tmp_path)
  sink.write(1, {"round": 1, "train/loss": 2.5, "clients/sampled": 10})
  # Flushed each round: readable before close.
  assert _scalars(_load(tmp_path)) == {"train/loss": [(1, 2.5)], "clients/sampled": [(1, 10.0)]}
  sink.write(2, {"round": 2, "train/loss": 1.25, "clients/sampled": 10, "eval/accuracy": 0.75})
  sink.close()
  assert _scalars(_load(tmp_path)) == {
      "train/loss": [(1, 2.5), (2, 1.25)],
      "clients/sampled": [(1, 10.0), (2, 10.0)],
      "eval/accuracy": [(2, 0.75)],
  }


def test_composite_of_csv_and_tensorboard(tmp_path):
  with CompositeSink([CsvSink(tmp_path / "metrics.csv"), TensorBoardSink(tmp_path)]) as sink:
    sink.write(1, {"round": 1, "train/loss": 0.5})
  assert read_metrics_csv(tmp_path / "metrics.csv") == [{"round": 1, "train/loss": 0.5}]
  assert _scalars(_load(tmp_path)) == {"train/loss": [(1, 0.5)]}


def test_hparams_and_final_metrics_read_back(tmp_path):
  run_dir = tmp_path / "exp" / "20250102-030405"
  run_dir.mkdir(parents=True)
  hparams = flat_hparams({"algorithm": {"name": "fedavg", "client_lr": 0.1},
                          "rounds": 20, "encoder": {"bits": 8, "enabled": True},
                          "seed": None})
  assert hparams == {"algorithm.name": "fedavg", "algorithm.client_lr": 0.1, "rounds": 20,
                     "encoder.bits": 8, "encoder.enabled": True, "seed": "None"}
  write_hparams(run_dir, hparams, {"eval/accuracy": 0.875, "total_bits": 1.5e9}, step=20)

  acc = _load(run_dir)
  start = acc.Tensors(hparams_metadata.SESSION_START_INFO_TAG)
  assert len(start) == 1
  content = acc.SummaryMetadata(hparams_metadata.SESSION_START_INFO_TAG).plugin_data.content
  info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
  assert info.group_name == "20250102-030405"
  assert {k: v.WhichOneof("kind") for k, v in info.hparams.items()} == {
      "algorithm.name": "string_value", "algorithm.client_lr": "number_value",
      "rounds": "number_value", "encoder.bits": "number_value",
      "encoder.enabled": "bool_value", "seed": "string_value"}
  assert info.hparams["algorithm.name"].string_value == "fedavg"
  assert info.hparams["algorithm.client_lr"].number_value == 0.1
  assert info.hparams["rounds"].number_value == 20
  assert info.hparams["encoder.enabled"].bool_value is True
  assert _scalars(acc) == {"final/eval/accuracy": [(20, 0.875)],
                           "final/total_bits": [(20, 1.5e9)]}


def test_hparams_reject_non_scalar_values(tmp_path):
  with pytest.raises(TypeError, match="hparam 'layers'"):
    write_hparams(tmp_path, {"layers": [1, 2]}, {})


def _experiment(experiment_dir):
  acc = _load(experiment_dir)
  content = acc.SummaryMetadata(hparams_metadata.EXPERIMENT_TAG).plugin_data.content
  experiment = hparams_metadata.parse_experiment_plugin_data(content)
  return ([h.name for h in experiment.hparam_infos],
          [(m.name.group, m.name.tag) for m in experiment.metric_infos])


def test_experiment_config_puts_varying_keys_first_and_each_metric_once(tmp_path):
  base = {"name": "exp", "seed": 1, "algorithm": {"name": "fedavg", "lr": 0.1}, "rounds": 3}
  runs = {"plain": base,
          "u8": dict(base, algorithm={"name": "fedavg", "lr": 0.2}, compression={"bits": 8})}
  final = {"eval/accuracy": 0.5, "train/loss": 1.0}
  for name, config in runs.items():
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    write_hparams(run_dir, flat_hparams(config), final, step=3)
    # What each run's session scalars add as metrics if left to the plugin.
    TensorBoardSink(run_dir / "simulated_time").write(7, {"eval/accuracy": 0.5})

  hparams, metrics = _experiment(tmp_path)
  assert hparams == ["algorithm.lr", "compression.bits", "name", "seed", "algorithm.name",
                     "rounds"]
  assert metrics == [("", "final/eval/accuracy"), ("", "final/train/loss")]
  assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1  # the newest config only
