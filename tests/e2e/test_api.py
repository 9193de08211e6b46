"""The Python API end to end: backup clients, stateful clients, sizing per round."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import yaml

import fedsim

BASE = {
    "name": "api", "seed": 1, "rounds": 2, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 8, "partition": "iid", "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg"},
}
PARAMS = 64 * 10 + 10
# Besides its update a FedAvg client sends its example weight and three metric
# sums (loss, correct predictions, examples), one float32 each.
OTHER_BITS = 4 * 32


@pytest.mark.slow
def test_backup_clients_count_broadcast_not_late_uploads(tff_runtime, tmp_path):
  config = dict(BASE, backup_clients=2,
                system={"speed": "lognormal", "sigma": 1.0, "dropout_probability": 0.2})
  result = fedsim.run(config, logdir=tmp_path)
  for row in result.metrics:
    sampled, aggregated = row["clients/sampled"], row["clients/aggregated"]
    assert sampled == 5 and aggregated <= 3
    assert row["clients/dropped"] == sampled - aggregated
    assert row["broadcast_bits"] == sampled * PARAMS * 32
    assert row["aggregate_bits"] == aggregated * (PARAMS * 32 + OTHER_BITS)
    assert row["aggregate_model_bits_per_client"] == PARAMS * 32
  assert result.size_info.broadcast_history == [r["broadcast_bits"] for r in result.metrics]
  simulated = np.cumsum([r["round_simulated_seconds"] for r in result.metrics])
  np.testing.assert_allclose([r["simulated_seconds"] for r in result.metrics], simulated)
  # Accuracy against cumulative bits both ways, one point per evaluation.
  evals = [r for r in result.metrics if "eval/accuracy" in r]
  assert evals and _scalar_points(result.run_dir, "eval/accuracy_by_bits") == [
      (r["cumulative_broadcast_bits"] + r["cumulative_aggregate_bits"],
       pytest.approx(r["eval/accuracy"])) for r in evals]


def _scalar_points(log_dir, tag: str) -> list[tuple[int, float]]:
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.util import tensor_util
  accumulator = event_accumulator.EventAccumulator(
      str(log_dir), size_guidance={event_accumulator.TENSORS: 0})
  accumulator.Reload()
  return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
          for e in accumulator.Tensors(tag)]


@pytest.mark.slow
def test_easgd_keeps_client_state_on_disk_and_variants_run(tff_runtime, tmp_path):
  config = dict(BASE, algorithm={"name": "easgd", "communication_period": 2},
                variants={"plain": {}, "u8": {"compression": {"aggregation": {
                    "encoder": "uniform", "bits": 8, "min_elements": 100}}}})
  results = fedsim.run(config, logdir=tmp_path)
  assert list(results) == ["plain", "u8"]
  plain = results["plain"]
  states = sorted(p.name for p in (plain.run_dir / "client_states").iterdir())
  sampled = {r for r in states}
  assert 3 <= len(sampled) <= 6 and all(s.endswith(".npz") for s in states)
  rows = list(csv.DictReader(open(plain.run_dir / "metrics.csv")))
  assert len(rows) == 2
  # 8-bit on the 640-element kernel: ceil(640*8/28) int32 + min/max, bias stays float.
  u8 = results["u8"].metrics[0]
  assert u8["aggregate_model_bits_per_client"] == (-(-640 * 8 // 28)) * 32 + 64 + 10 * 32
  assert u8["broadcast_model_bits_per_client"] == PARAMS * 32


@pytest.mark.slow
def test_inprocess_runtime_matches_local(tff_runtime, tmp_path, capsys):
  config = dict(BASE, backup_clients=1, system={"speed": "lognormal"},
                variants={"local": {}, "inprocess": {"runtime": {"name": "inprocess"}}})
  results = fedsim.run(config, logdir=tmp_path)
  local, inprocess = results["local"].metrics, results["inprocess"].metrics
  for a, b in zip(local, inprocess):
    for key in ("train/loss", "eval/loss", "eval/accuracy", "broadcast_bits", "aggregate_bits"):
      np.testing.assert_allclose(b[key], a[key], rtol=1e-5, err_msg=key)
  assert "using local" not in capsys.readouterr().err


# Clients that keep state: the runs sample 3 of 8 clients for 4 rounds, so
# states are carried over and read back, from memory or from disk.
STATEFUL_RUNS = {
    "easgd": {"algorithm": {"name": "easgd", "communication_period": 2}},
    "scaffold": {"algorithm": {"name": "scaffold"}},
    "topk_error_feedback": {"aggregation": [{"name": "encode", "encoder": "topk", "k": 20,
                                             "min_elements": 100, "error_feedback": True}]},
}


@pytest.mark.slow
# The client-state store (memory, spill to disk) does not depend on what a state
# holds: easgd (its local model) runs in every run; scaffold and top-k error
# feedback are `-m long` (~45 s), and runtime/test_client_states.py keeps each
# one's states on inprocess equal to TFF's runtime in the default run.
@pytest.mark.parametrize("variant", [
    pytest.param(v, marks=() if v == "easgd" else pytest.mark.long) for v in sorted(STATEFUL_RUNS)])
def test_stateful_clients_on_inprocess_equal_local_with_any_memory_budget(
    tff_runtime, tmp_path, capsys, variant):
  inprocess = {"name": "inprocess", "device": "cpu"}
  config = dict(BASE, rounds=4, **STATEFUL_RUNS[variant], variants={
      "local": {},
      "inprocess": {"runtime": inprocess},
      # No memory: every state goes to disk and is read back from there.
      "spilled": {"runtime": {**inprocess, "client_state_memory_mb": 0}}})
  results = fedsim.run(config, logdir=tmp_path)
  assert "using local" not in capsys.readouterr().err
  want = results["local"]
  for name in ("inprocess", "spilled"):
    got = results[name]
    for g, w in zip(got.final_weights, want.final_weights, strict=True):
      np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    for a, b in zip(want.metrics, got.metrics, strict=True):
      for key in ("train/loss", "eval/accuracy"):
        np.testing.assert_allclose(b[key], a[key], rtol=1e-6, atol=1e-6, err_msg=key)
  # Every sampled client's state is in the run directory after the last checkpoint.
  sampled = {c for row in csv.DictReader(open(want.run_dir / "clients.csv"))
             for c in row["aggregated"].split()}
  for name in ("inprocess", "spilled"):
    files = {p.stem for p in (results[name].run_dir / "client_states").glob("*.npz")}
    assert files == sampled


@pytest.mark.slow
def test_on_round_gets_weights_and_client_ids_which_clients_csv_records(tff_runtime, tmp_path):
  config = dict(BASE, rounds=3, backup_clients=1,
                system={"speed": "lognormal", "dropout_probability": 0.3})
  seen, legacy = [], []
  result = fedsim.run(config, logdir=tmp_path,
                      on_round=lambda r, metrics, info: seen.append((r, metrics, info)))
  fedsim.run(config, logdir=tmp_path, on_round=lambda r, metrics: legacy.append(r))
  assert legacy == [1, 2, 3] and [r for r, _, _ in seen] == [1, 2, 3]
  rows = list(csv.DictReader(open(result.run_dir / "clients.csv")))
  assert [r["round"] for r in rows] == ["1", "2", "3"]
  for (r, metrics, info), row in zip(seen, rows):
    assert isinstance(info, fedsim.RoundInfo)
    assert len(info.sampled) == metrics["clients/sampled"] == 4
    assert len(info.aggregated) == metrics["clients/aggregated"]
    assert set(info.aggregated) <= set(info.sampled)
    assert row["sampled"].split() == list(info.sampled)
    assert row["aggregated"].split() == list(info.aggregated)
    assert row["staleness"] == "" and info.staleness is None  # synchronous
  # The last round's weights are the model the run ends with.
  for got, want in zip(seen[-1][2].weights, result.final_weights):
    np.testing.assert_array_equal(got, want)
  assert [w.shape for w in seen[0][2].weights] == [(64, 10), (10,)]


def _blobs(num_clients: int = 3, per_client: int = 12, features: int = 4):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(num_clients * per_client + 9, features)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)  # 3 classes
  clients = {f"c{i}": (x[i * per_client:(i + 1) * per_client], y[i * per_client:(i + 1) * per_client])
             for i in range(num_clients)}
  return {"clients": clients, "test": (x[-9:], y[-9:])}


@pytest.mark.slow
@pytest.mark.parametrize("form", ["dict", "FederatedData"])
def test_data_and_model_objects(tff_runtime, tmp_path, form):
  import tensorflow as tf
  from fedsim.data import Examples, FederatedData
  blobs = _blobs()
  data = blobs if form == "dict" else FederatedData(
      {c: Examples(*xy) for c, xy in blobs["clients"].items()}, Examples(*blobs["test"]),
      (4,), 3)
  calls = []

  def make_model(input_shape, num_classes):
    calls.append((tuple(input_shape), num_classes))
    return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Dense(num_classes)])

  config = dict(BASE, rounds=1, clients_per_round=2)  # digits + logistic, both replaced
  result = fedsim.run(config, logdir=tmp_path, data=data, model=make_model)
  assert calls and set(calls) == {((4,), 3)}
  row = result.metrics[0]
  assert row["broadcast_model_bits_per_client"] == (4 * 3 + 3) * 32
  assert row["train/num_examples"] == 2 * 12  # two of our 12-example clients
  resolved = yaml.safe_load((result.run_dir / "config.yaml").read_text())
  assert resolved["data"]["name"] == "custom" and resolved["data"]["batch_size"] == 16
  assert resolved["data"]["builder"].startswith("fedsim.api:passed.data_")
  assert resolved["model"]["name"] == "keras"
  assert set(row) >= {"eval/accuracy"}


@pytest.mark.parametrize("config", [5, None, [BASE]])
def test_a_config_that_is_neither_a_path_nor_a_mapping_is_named(config):
  """5 was read as file descriptor 5; None and a list ended in os's TypeError."""
  with pytest.raises(fedsim.UserError) as error:
    fedsim.validate(config)
  assert str(error.value).startswith("config: expected a YAML file's path or a mapping of"
                                     f" config keys, got {type(config).__name__} ")


def test_an_on_round_that_is_not_callable_is_refused_before_anything_runs(tmp_path):
  """It trained the first round, then failed the run on calling it."""
  with pytest.raises(fedsim.UserError, match=r"^on_round: expected a function of \(round,"
                                             r" metrics\[, info\]\), got int 5$"):
    fedsim.run(BASE, logdir=tmp_path / "runs", on_round=5)
  assert not (tmp_path / "runs").exists()
