"""TensorBoard outputs, read back from the event files (imports TensorFlow)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

from fedsim.reporting import sinks
from fedsim.reporting.board_tags import board_tag
from fedsim.reporting.hparams import flat_hparams, informative_first, write_events, write_sessions
from fedsim.reporting.run_records import Run
from fedsim.reporting.sinks import (CompositeSink, CsvSink, TensorBoardSink, load_tensorflow,
                                    read_metrics_csv)


def _load(path):
  acc = event_accumulator.EventAccumulator(
      str(path), size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  return acc


def _scalars(acc):
  return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
          for tag in acc.Tags()["tensors"] if not tag.startswith("_hparams_")}


def test_scalars_use_board_tags_and_round_steps(tmp_path):
  sink = TensorBoardSink(tmp_path)
  sink.write(1, {"round": 1, "train/loss": 2.5, "clients/sampled": 10})
  # Flushed each round: readable before close.
  assert _scalars(_load(tmp_path)) == {"train/loss": [(1, 2.5)],
                                       "system/clients/sampled": [(1, 10.0)]}
  sink.write(2, {"round": 2, "train/loss": 1.25, "clients/sampled": 10, "eval/accuracy": 0.75,
                 "aggregate_bits": 800})
  sink.close()
  assert _scalars(_load(tmp_path)) == {
      "train/loss": [(1, 2.5), (2, 1.25)],
      "system/clients/sampled": [(1, 10.0), (2, 10.0)],
      "eval/accuracy": [(2, 0.75)],
      "sent/aggregate_bits": [(2, 800.0)],
  }


def _records(log_dir):
  """Every record of every file in `log_dir`, in file then record order."""
  tf = load_tensorflow()
  return [record.numpy() for path in sorted(log_dir.glob("events.out.tfevents.*"))
          for record in tf.data.TFRecordDataset(str(path))]


def _events(log_dir):
  tf = load_tensorflow()
  return [tf.compat.v1.Event.FromString(record) for record in _records(log_dir)]


def test_events_are_those_tf_summary_scalar_writes(tmp_path):
  # Step 0 leaves the step out, 300 needs two varint bytes, a long tag a long summary.
  rounds = [{"round": 1, "train/loss": 2.5, "clients/sampled": 10, "bits": 2**40 + 1},
            {"round": 2, "train/loss": float("nan"), "eval/accuracy": 0.1, "big": 3.4e38},
            {"round": 0, "train/loss": 1.0},
            {"round": 300, "x" * 200: -0.5}]
  sink = TensorBoardSink(tmp_path / "fedsim")
  for metrics in rounds:
    sink.write(metrics["round"], metrics)
  sink.close()
  tf = load_tensorflow()
  writer = tf.summary.create_file_writer(str(tmp_path / "tf"))
  for metrics in rounds:
    with writer.as_default(step=metrics["round"]):
      for name, value in metrics.items():
        if name != "round":
          tf.summary.scalar(board_tag(name), float(value))
  writer.close()
  records = _records(tmp_path / "fedsim")
  got, want = _events(tmp_path / "fedsim"), _events(tmp_path / "tf")
  assert got[0].file_version == want[0].file_version == "brain.Event:2"
  assert len(got) == len(want) == 9
  for record, g, w in zip(records[1:], got[1:], want[1:]):
    w.wall_time = g.wall_time
    assert record == w.SerializeToString()  # byte for byte, as protobuf writes it
  # Past float32's range tf.summary.scalar raises ValueError; the sink logs +-inf.
  sink = TensorBoardSink(tmp_path / "huge")
  sink.write(1, {"huge": 1e300, "tiny": -1e300})
  sink.close()
  assert _scalars(_load(tmp_path / "huge")) == {"system/huge": [(1, np.inf)],
                                                      "system/tiny": [(1, -np.inf)]}


def test_two_sinks_of_one_second_write_two_files_read_in_order(tmp_path, monkeypatch):
  # The process's 10th and 11th sinks: their counters gain a digit between them.
  monkeypatch.setattr(sinks, "_EVENT_FILES", itertools.count(9))
  for loss in (1.0, 2.0):
    sink = TensorBoardSink(tmp_path)
    sink.write(1, {"train/loss": loss})
    sink.close()
  assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
  assert _scalars(_load(tmp_path))["train/loss"] == [(1, 1.0), (1, 2.0)]


def test_an_event_file_that_cannot_be_created_is_an_os_error_naming_it(tmp_path):
  (tmp_path / "file").write_text("not a directory")
  with pytest.raises(OSError, match=str(tmp_path / "file")):
    TensorBoardSink(tmp_path / "file" / "run")


# metrics.csv's columns of experiments/compare_encoders.yaml's uniform8 run (3 rounds,
# 2026-11-28), plus a DP run's, a controller's and fedbuff's own.
COLUMNS = [
    "train/loss", "train/accuracy", "train/num_examples", "distributor/wire/packed_bits",
    "distributor/wire/entropy_bits", "aggregation/encode/wire/packed_bits",
    "aggregation/encode/wire/max_client_bits", "finalizer/update_non_finite",
    "clients/sampled", "clients/aggregated", "clients/dropped", "round_skipped",
    "round_simulated_seconds", "simulated_seconds", "round_seconds", "broadcast_bits",
    "aggregate_bits", "late_upload_bits", "cumulative_broadcast_bits",
    "cumulative_aggregate_bits", "broadcast_entropy_bits", "aggregate_bits_per_client_mean",
    "broadcast_model_bits_per_client", "eval/loss", "eval/accuracy", "eval/accuracy_by_bits",
    "eval/accuracy_by_simulated_ms", "eval_clients/accuracy_p10", "privacy/epsilon",
    "control/bits_mean",
    "staleness/mean", "server_updates_per_hour"]


def _tensorboard_groups(tags):
  """Groups in the order TensorBoard 2.14 shows them: tags sorted by name ('/' before
  any other character), grouped by the text before the first '/'."""
  ordered = sorted(tags, key=lambda tag: tag.replace("/", "\0"))
  return list(dict.fromkeys(tag.split("/", 1)[0] for tag in ordered))


def test_tensorboard_opens_on_eval_then_privacy_then_bits_sent():
  """Every group in the order TensorBoard shows them, each column under its own."""
  tags = {column: board_tag(column) for column in COLUMNS}
  assert _tensorboard_groups(tags.values()) == [
      "eval", "eval_clients", "privacy", "sent", "stages", "system", "train"]
  assert len(set(tags.values())) == len(COLUMNS)  # no two columns share a tag
  for column in ("eval/accuracy", "eval/accuracy_by_bits", "eval_clients/accuracy_p10",
                 "train/loss", "privacy/epsilon"):
    assert tags[column] == column
  for column in ("aggregate_bits", "cumulative_broadcast_bits", "late_upload_bits",
                 "control/bits_mean"):
    assert tags[column] == "sent/" + column
  for column in ("aggregation/encode/wire/packed_bits", "distributor/wire/entropy_bits",
                 "finalizer/update_non_finite"):
    assert tags[column] == "stages/" + column
  for column in ("clients/sampled", "staleness/mean", "round_seconds", "simulated_seconds",
                 "server_updates_per_hour"):
    assert tags[column] == "system/" + column


def test_composite_of_csv_and_tensorboard(tmp_path):
  with CompositeSink([CsvSink(tmp_path / "metrics.csv"), TensorBoardSink(tmp_path)]) as sink:
    sink.write(1, {"round": 1, "train/loss": 0.5})
  assert read_metrics_csv(tmp_path / "metrics.csv") == [{"round": 1, "train/loss": 0.5}]
  assert _scalars(_load(tmp_path)) == {"train/loss": [(1, 0.5)]}


def _run(path, config, metrics):
  path.mkdir(parents=True)
  return Run(name=path.name, path=path, status="completed", message="", config=config,
             metrics=metrics)


def _session(run_dir):
  acc = _load(run_dir)
  content = acc.SummaryMetadata(hparams_metadata.SESSION_START_INFO_TAG).plugin_data.content
  info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
  return info, _scalars(acc)


def test_flat_hparams_are_dotted_leaves():
  assert flat_hparams({"algorithm": {"name": "fedavg", "client_lr": 0.1}, "rounds": 20,
                       "encoder": {"bits": 8, "enabled": True}, "seed": None}) == {
      "algorithm.name": "fedavg", "algorithm.client_lr": 0.1, "rounds": 20,
      "encoder.bits": 8, "encoder.enabled": True, "seed": "None"}


def test_sessions_fill_every_column_and_carry_the_ranking_metrics(tmp_path):
  base = {"name": "exp", "seed": 1, "rounds": 3, "compression": None}
  u8 = dict(base, compression={"aggregation": {"encoder": "uniform", "bits": 8}})
  # 100 + 100 bits a round uncompressed, 100 + 25 with 8-bit uploads.
  rows = lambda up, accuracies: [
      {"round": r, "cumulative_broadcast_bits": 100 * r, "cumulative_aggregate_bits": up * r,
       "simulated_seconds": 0.5 * r, "eval/accuracy": a} for r, a in enumerate(accuracies, 1)]
  runs = [_run(tmp_path / "none", base, rows(100, [0.5, 0.8, 0.9])),
          _run(tmp_path / "u8", u8, rows(25, [0.6, 0.85, 0.8]))]
  write_config = write_sessions(runs)

  none, none_scalars = _session(tmp_path / "none")
  u8_info, u8_scalars = _session(tmp_path / "u8")
  assert none.group_name == "none" and u8_info.group_name == "u8"
  assert none.hparams["compression.aggregation.encoder"].string_value == "identity"
  assert none.hparams["compression.aggregation.bits"].string_value == "none"
  assert u8_info.hparams["compression.aggregation.bits"].number_value == 8
  assert "compression" not in none.hparams and set(none.hparams) == set(u8_info.hparams)
  # Target: 0.9 x the best accuracy (0.9) = 0.81, reached at round 3 and round 2.
  assert none_scalars == {"final/eval/accuracy": [(3, pytest.approx(0.9))],
                          "final/total_bits": [(3, 600.0)],
                          "final/simulated_seconds": [(3, 1.5)],
                          "final/bits_to_target": [(3, 600.0)],
                          "final/simulated_seconds_to_target": [(3, 1.5)]}
  assert u8_scalars["final/bits_to_target"] == [(3, 250.0)]
  assert u8_scalars["final/simulated_seconds_to_target"] == [(3, 1.0)]

  (session,) = (tmp_path / "u8").glob("events.out.tfevents.*")
  written = session.stat()
  write_sessions(runs)  # again, unchanged: the session on disk is kept as it is
  assert [(p, p.stat().st_mtime_ns, p.stat().st_ino) for p in (tmp_path / "u8").glob(
      "events.out.tfevents.*")] == [(session, written.st_mtime_ns, written.st_ino)]
  (kept,) = (tmp_path / "none").glob("events.out.tfevents.*")
  better = _run(tmp_path / "better", base, rows(100, [0.5, 0.9, 1.0]))
  write_sessions([*runs, better])  # a new best run moves the target to 0.9
  (rewritten,) = (tmp_path / "u8").glob("events.out.tfevents.*")   # still one session
  assert rewritten != session and not session.exists()
  assert "final/bits_to_target" not in _session(tmp_path / "u8")[1]  # u8 never reaches 0.9
  assert list((tmp_path / "none").glob("events.out.tfevents.*")) == [kept]  # reached it as at 0.81
  board = tmp_path / "board"
  board.mkdir()
  tf = load_tensorflow()
  write_events(tf, board, 0, write_config, ".test")
  acc = _load(board)
  content = acc.SummaryMetadata(hparams_metadata.EXPERIMENT_TAG).plugin_data.content
  experiment = hparams_metadata.parse_experiment_plugin_data(content)
  assert [(h.name, h.differs) for h in experiment.hparam_infos] == [
      ("compression.aggregation.encoder", True), ("compression.aggregation.bits", True),
      ("name", False), ("seed", False), ("rounds", False)]
  assert [m.name.tag for m in experiment.metric_infos][:3] == [
      "final/eval/accuracy", "final/total_bits", "final/bits_to_target"]
  assert experiment.metric_infos[2].description == (
      "target: eval accuracy 0.8100 (90% of the best run's; `fedsim compare --target` sets it)")


def test_a_given_target_is_the_one_to_target_metrics_use(tmp_path):
  config = {"name": "exp", "seed": 1}
  rows = lambda accuracies: [{"round": r, "cumulative_broadcast_bits": 100 * r,
                              "cumulative_aggregate_bits": 100 * r, "eval/accuracy": a}
                             for r, a in enumerate(accuracies, 1)]
  runs = [_run(tmp_path / "a", config, rows([0.5, 0.7, 0.9])),
          _run(tmp_path / "b", config, rows([0.65, 0.6, 0.62]))]
  write_config = write_sessions(runs, target=0.6)
  # 0.6: a reaches it at round 2 (400 bits), b at round 1 (200 bits).
  assert _session(tmp_path / "a")[1]["final/bits_to_target"] == [(3, 400.0)]
  assert _session(tmp_path / "b")[1]["final/bits_to_target"] == [(3, 200.0)]
  write_sessions(runs, target=0.95)  # reached by no run: no value
  assert "final/bits_to_target" not in _session(tmp_path / "a")[1]
  board = tmp_path / "board"
  board.mkdir()
  write_events(load_tensorflow(), board, 0, write_config, ".test")
  content = _load(board).SummaryMetadata(hparams_metadata.EXPERIMENT_TAG).plugin_data.content
  (to_target,) = [m for m in hparams_metadata.parse_experiment_plugin_data(content).metric_infos
                  if m.name.tag == "final/bits_to_target"]
  assert to_target.description == (
      "target: eval accuracy 0.6000, as given to `fedsim compare --target`")


def test_hparams_defaults_are_the_study_knobs_not_what_follows_from_them():
  """experiments/compare_encoders.yaml's four variants: the dashboard shows the first 5
  columns, so broadcast's encoder and bits (which tell the variants apart) come first,
  then what they determine: the same aggregation keys (3 values each), then
  min_elements (2: only the baseline lacks it), then the rest."""
  none = {"seed": 0, "compression": "None"}
  variant = lambda encoder, bits: {"seed": 0, **{
      f"compression.{d}.{k}": v for d in ("broadcast", "aggregation")
      for k, v in (("encoder", encoder), ("bits", bits), ("min_elements", 10000))}}
  runs = [none, variant("uniform", 8), variant("uniform", 4), variant("hadamard", 8)]
  assert informative_first(runs) == [
      ("compression", True), ("compression.broadcast.encoder", True),
      ("compression.broadcast.bits", True), ("compression.aggregation.encoder", True),
      ("compression.aggregation.bits", True), ("compression.broadcast.min_elements", True),
      ("compression.aggregation.min_elements", True), ("seed", False)]
  # Without the baseline, min_elements no longer differs.
  assert [key for key, differs in informative_first(runs[1:]) if differs] == [
      "compression.broadcast.encoder", "compression.broadcast.bits",
      "compression.aggregation.encoder", "compression.aggregation.bits"]
  # A knob that varies on its own beside the encoder is informative even after
  # keys it does not follow from.
  runs = [{"a": 1, "b": 1, "lr": 0.1}, {"a": 2, "b": 2, "lr": 0.1}, {"a": 2, "b": 2, "lr": 0.2}]
  assert informative_first(runs) == [("a", True), ("lr", True), ("b", True)]


def test_the_clock_chart_is_there_only_for_a_run_modelling_devices_or_links():
  from fedsim.reporting.board import BY_SIMULATED_TIME, layout_proto, models_clock
  system = lambda **keys: {"system": {"speed": "constant", "profiles": None, **keys}}
  assert not models_clock({})
  # Uneven clients or a deadline make rounds differ, but only by examples x seconds_per_example.
  assert not models_clock(system(deadline_seconds=2.0, dropout_probability=0.5))
  assert models_clock(system(speed="lognormal"))
  assert models_clock(system(profiles={"up_bps": {"median": 1e5}}))
  titles = lambda layout: [c.title for category in layout.category for c in category.chart]
  assert BY_SIMULATED_TIME in titles(layout_proto(with_clock=True))
  assert BY_SIMULATED_TIME not in titles(layout_proto(with_clock=False))


def test_a_compare_target_is_kept_for_later_refreshes(tmp_path):
  from fedsim.errors import UserError
  from fedsim.reporting.board import COMPARISON_RUN, TARGET_FILE, refresh, stored_target
  assert stored_target(tmp_path) is None
  assert refresh(tmp_path, target=0.85) is None  # no run yet: kept all the same
  assert stored_target(tmp_path) == 0.85
  (tmp_path / COMPARISON_RUN / TARGET_FILE).write_text("high\n")
  with pytest.raises(UserError, match=f"{TARGET_FILE}: not an eval accuracy: 'high'"):
    stored_target(tmp_path)


def test_a_refresh_reads_each_runs_config_once(tmp_path, monkeypatch):
  """The board is refreshed each time a run of the experiment completes, and
  reads every run: it read each config twice (once more for the figure), with
  PyYAML's Python parser (0.67 s a read at 100 runs, 0.16 s with libyaml's)."""
  from fedsim.reporting import board, run_records
  for name, accuracy in (("a", 0.5), ("b", 0.75)):
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(f"name: x\nseed: 1\nrounds: 1\nlabel: {name}\n")
    (run_dir / "metrics.csv").write_text(
        f"round,eval/accuracy,broadcast_bits,aggregate_bits\n1,{accuracy},100,200\n")
    (run_dir / "status").write_text("completed\n")
  reads = []
  real = run_records.read_run_config
  monkeypatch.setattr(run_records, "read_run_config", lambda path: reads.append(path) or real(path))
  assert board.refresh(tmp_path) == tmp_path / board.COMPARISON_RUN
  assert sorted(path.parent.name for path in reads) == ["a", "b"]
  assert [real(path)["label"] for path in sorted(reads)] == ["a", "b"]


def test_a_rewound_session_is_written_again_when_the_run_completes_again(tmp_path):
  """A completed run resumed from a checkpoint (an older one, when the newest
  is damaged) loses its HParams session to the rewind (logged after every
  checkpoint); completed again with the same values, its session must be
  written again, not taken from the emptied file kept under its name."""
  import time
  from fedsim.state.checkpoint import Checkpoint
  from fedsim.state.rewind import rewind_logs
  rows = [{"round": r, "cumulative_broadcast_bits": 100 * r, "cumulative_aggregate_bits": 100 * r,
           "eval/accuracy": 0.5 + r / 10} for r in (1, 2, 3)]
  runs = [_run(tmp_path / "a", {"name": "exp", "seed": 1}, rows)]
  checkpoint_taken = time.time()
  time.sleep(0.01)
  write_sessions(runs)
  want = _session(tmp_path / "a")[1]
  assert want["final/total_bits"] == [(3, 600.0)]
  rewind_logs(tmp_path / "a", Checkpoint(path=tmp_path / "a" / "checkpoints", round_num=2,
                                         simulated_seconds=0.0, broadcast_history=(),
                                         aggregate_history=(), wall_time=checkpoint_taken))
  assert not list((tmp_path / "a").glob("events.out.tfevents.*"))
  write_sessions(runs)  # the resumed run completed with the same values
  assert _session(tmp_path / "a")[1] == want
