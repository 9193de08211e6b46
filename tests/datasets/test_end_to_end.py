"""`fedsim.run` on tiny files in TFF's format: EMNIST with `cnn`, Shakespeare with `lstm`."""

from __future__ import annotations

import pytest

import fedsim

pytestmark = pytest.mark.slow


def run(cache_dir, logdir, data, model, clients_per_round=2):
  config = {"name": "tiny", "seed": 1, "rounds": 2, "clients_per_round": clients_per_round,
            "data": {"cache_dir": str(cache_dir), **data}, "model": model,
            "algorithm": {"name": "fedavg",
                          "client_optimizer": {"name": "sgd", "learning_rate": 0.1}}}
  return fedsim.run(config, logdir=logdir, progress=False)


@pytest.fixture
def one_cache_dir(tmp_path):
  from tests.datasets import conftest, tff_sqlite
  for name, rows in conftest._ROWS.items():
    tff_sqlite.write(tmp_path / name, rows())
  return tmp_path


def test_emnist_cnn(tff_runtime, one_cache_dir, tmp_path):
  result = run(one_cache_dir, tmp_path / "runs", {"name": "emnist", "batch_size": 4},
               {"name": "cnn", "filters": [4, 8], "dense": 16})
  assert [m["round"] for m in result.metrics] == [1, 2]
  # Two clients of 5 examples each round, one epoch.
  assert [m["train/num_examples"] for m in result.metrics] == [10.0, 10.0]
  params = (5 * 5 * 4 + 4) + (5 * 5 * 4 * 8 + 8) + (7 * 7 * 8 * 16 + 16) + (16 * 10 + 10)
  assert result.metrics[0]["broadcast_model_bits_per_client"] == params * 32
  assert 0.0 <= result.metrics[-1]["eval/accuracy"] <= 1.0


def test_shakespeare_lstm(tff_runtime, one_cache_dir, tmp_path):
  result = run(one_cache_dir, tmp_path / "runs",
               {"name": "shakespeare", "batch_size": 4, "sequence_length": 20},
               {"name": "lstm", "embedding": 8, "units": [16]}, clients_per_round=3)
  assert [m["round"] for m in result.metrics] == [1, 2]
  params = 90 * 8 + 4 * 16 * (8 + 16 + 1) + 16 * 90 + 90
  assert result.metrics[0]["broadcast_model_bits_per_client"] == params * 32
  # Three roles of 2 snippets, 155, 147 and 144 tokens: windows of 21 -> 8 + 7 + 7.
  assert result.metrics[0]["train/num_examples"] == 22.0
  loss = result.metrics[-1]["eval/loss"]
  assert 0.0 < loss < 2 * 4.5  # ln(90) = 4.50 at chance


def test_population_too_small_for_backup_clients_fails_before_the_run(one_cache_dir, tmp_path):
  """EMNIST's population is known only once its file is read (no data.num_clients)."""
  config = {"name": "tiny", "rounds": 1, "clients_per_round": 2, "backup_clients": 50,
            "data": {"name": "emnist", "cache_dir": str(one_cache_dir), "batch_size": 4},
            "model": {"name": "logistic"}}
  with pytest.raises(fedsim.UserError, match=r"^backup_clients: 52 clients per round"):
    fedsim.run(config, logdir=tmp_path / "runs", progress=False)
  assert not (tmp_path / "runs").exists()
