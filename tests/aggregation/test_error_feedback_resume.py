"""FedAvg with error feedback on a top-k (or warm-started PowerSGD) upload: the
clients' residuals live on disk, are checkpointed, and a resumed run equals the
uninterrupted one bit for bit."""

from __future__ import annotations

import csv

import numpy as np
import pytest

import fedsim

CONFIG = {
    "name": "ef_resume", "seed": 4, "rounds": 4, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 6, "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg"},
    "aggregation": [{"name": "encode", "encoder": "topk", "k": 20, "min_elements": 100,
                     "error_feedback": True}],
    "runtime": {"name": "inprocess"},
    "eval": {"every": 1}, "checkpoint": {"every": 2},
}
WALL_CLOCK = ("round_seconds",)


def _ages_by_hand(run_dir):
  """(mean, max) age of the residuals each round's aggregated clients carry in
  (rounds since each last took part), from clients.csv; None where none carries one."""
  last, out = {}, []
  with open(run_dir / "clients.csv", newline="", encoding="utf-8") as f:
    for row in csv.DictReader(f):
      round_num, ids = int(row["round"]), row["aggregated"].split()
      ages = [round_num - last[c] for c in ids if c in last]
      out.append((float(np.mean(ages)), float(max(ages))) if ages else (None, None))
      last.update({c: round_num for c in ids})
  return out


def _rows(result):
  return [{k: v for k, v in row.items() if k not in WALL_CLOCK} for row in result.metrics]


# PowerSGD's warm start adds server state (Q) and the clients' copy of it
# (client-work state): both are checkpointed too.
POWERSGD = {"name": "encode", "encoder": "powersgd", "rank": 1, "min_elements": 100,
            "error_feedback": True}


@pytest.mark.slow
# fedsgd-topk is `-m long` (~25 s): the residuals' checkpoint is the same for
# both algorithms (fedavg-topk keeps it in every run), and
# runtime/test_client_states.py keeps fedsgd's residuals equal to TFF's runtime.
@pytest.mark.parametrize("algorithm, stage", [
    ("fedavg", None), pytest.param("fedsgd", None, marks=pytest.mark.long), ("fedavg", POWERSGD)],
    ids=["fedavg-topk", "fedsgd-topk", "fedavg-powersgd"])
def test_resumed_error_feedback_run_equals_the_uninterrupted_one(tmp_path, algorithm, stage):
  config = dict(CONFIG, algorithm={"name": algorithm})
  if stage is not None:
    config["aggregation"] = [stage]
  whole = fedsim.run(config, logdir=tmp_path / "whole", progress=False)
  half = fedsim.run(config, ["rounds=2"], logdir=tmp_path / "parts", progress=False)
  resumed = fedsim.run(config, logdir=tmp_path / "parts", progress=False, resume=half.run_dir)
  rows = _rows(whole)
  # Top-20 or rank 1 of a 640-element kernel drops most of each update.
  assert all(row["error_feedback/residual_norm"] > 0 for row in rows)
  # 3 of 6 clients a round: residuals age; their ages follow clients.csv.
  assert [(row.get("error_feedback/residual_age_mean"), row.get("error_feedback/residual_age_max"))
          for row in rows] == _ages_by_hand(whole.run_dir)
  assert any(row.get("error_feedback/residual_age_max", 0) > 1 for row in rows)
  assert _rows(resumed) == rows
  for got, want in zip(resumed.final_weights, whole.final_weights):
    np.testing.assert_array_equal(got, want)
  # The residuals matter: without them the same run ends elsewhere.
  plain = dict(config, aggregation=[dict(config["aggregation"][0], error_feedback=False)])
  other = fedsim.run(plain, logdir=tmp_path / "plain", progress=False)
  assert "error_feedback/residual_norm" not in other.metrics[0]
  assert not np.array_equal(other.final_weights[0], whole.final_weights[0])


@pytest.mark.slow
def test_error_feedback_with_kept_optimizer_state_resumes_bit_for_bit(tmp_path):
  config = dict(CONFIG, algorithm={"name": "fedavg", "client_optimizer_state": "keep",
                                   "client_optimizer": {"name": "sgd", "learning_rate": 0.1,
                                                        "momentum": 0.9}})
  whole = fedsim.run(config, logdir=tmp_path / "whole", progress=False)
  half = fedsim.run(config, ["rounds=2"], logdir=tmp_path / "parts", progress=False)
  resumed = fedsim.run(config, logdir=tmp_path / "parts", progress=False, resume=half.run_dir)
  assert _rows(resumed) == _rows(whole)
  for got, want in zip(resumed.final_weights, whole.final_weights):
    np.testing.assert_array_equal(got, want)
