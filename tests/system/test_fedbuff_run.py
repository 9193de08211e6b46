"""FedBuff runs on the simulated clock: synchronous FedAvg as its special case, the
event schedule against a reference written from the paper's Algorithm 1, and
repeatability."""

from __future__ import annotations

import csv
import heapq

import numpy as np
import pytest

import fedsim

WALL_CLOCK = ("round_seconds",)
BASE = {
    "name": "fedbuff", "seed": 4, "rounds": 3, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 8, "partition": "dirichlet", "alpha": 1.0,
             "batch_size": 16},
    "model": {"name": "logistic"}, "eval": {"every": 1},
}
U8 = {direction: {"encoder": "uniform", "bits": 8, "min_elements": 100}
      for direction in ("aggregation", "broadcast")}


def _clients_csv(run_dir):
  with open(run_dir / "clients.csv", newline="", encoding="utf-8") as f:
    return list(csv.DictReader(f))


def _same(a, b):
  for x, y in zip(a.final_weights, b.final_weights):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_fedbuff_without_staleness_is_fedavg_bit_for_bit(tff_runtime, tmp_path):
  # Equal local work and equal devices: every client of a cohort arrives at once,
  # so each buffer is one synchronous round (concurrency = K = clients_per_round).
  # With 8 bits both ways, clients train on the decoded 8-bit model in both.
  steps = {"local_steps": 3}
  weighted = dict(steps, client_weighting="num_examples", normalize="total_weight")
  config = dict(BASE, variants={
      "fedavg": {"algorithm": dict(steps, name="fedavg")},
      "fedbuff": {"algorithm": dict(weighted, name="fedbuff")},
      "fedavg_uniform_u8": {"algorithm": dict(steps, name="fedavg", client_weighting="uniform"),
                            "compression": U8},
      "fedbuff_u8": {"algorithm": dict(steps, name="fedbuff"), "compression": U8},
  })
  # Bit for bit on `local`, where FedBuff's dispatch and FedAvg's round train alike.
  runs = fedsim.run(dict(config, runtime={"name": "local"}), logdir=tmp_path)
  for sync, buffered in (("fedavg", "fedbuff"), ("fedavg_uniform_u8", "fedbuff_u8")):
    _same(runs[sync], runs[buffered])
    for s, b in zip(runs[sync].metrics, runs[buffered].metrics):
      for key in ("eval/accuracy", "train/loss", "simulated_seconds", "broadcast_bits",
                  "aggregate_bits"):
        assert s[key] == b[key], (buffered, key)
      assert b["staleness/max"] == 0 and b["clients/dispatched"] == 3
  for key in ("aggregate_bits_per_client", "broadcast_bits_per_client"):
    assert runs["fedbuff_u8"].metrics[0][key] < runs["fedbuff"].metrics[0][key] / 2
  # Each update's buffer is the synchronous round's cohort, all on the current model.
  sync_rows, buffered_rows = (_clients_csv(runs[n].run_dir) for n in ("fedavg", "fedbuff"))
  assert [r["round"] for r in buffered_rows] == ["1", "2", "3"]
  for s, b in zip(sync_rows, buffered_rows):
    assert len(b["sampled"].split()) == 3 and s["staleness"] == ""
    assert (b["sampled"], b["aggregated"]) == (s["sampled"], s["aggregated"])
    assert b["staleness"] == "0 0 0"


def _reference_schedule(durations, buffer_size, max_staleness, updates):
  """Algorithm 1 of the paper on a fixed population that is always training: each
  client reports every `durations[c]` seconds and at once downloads the newest
  model (after the update its own report may trigger). Per server update:
  (time, [(client, staleness)] of the buffered reports in arrival order, reports
  dropped, [clients that downloaded] since the previous update)."""
  events = [(d, c, 0) for c, d in enumerate(durations)]  # (arrival, client, version)
  heapq.heapify(events)
  version, buffer, dropped, downloads, out = 0, [], 0, list(range(len(durations))), []
  while len(out) < updates:
    t, c, v = heapq.heappop(events)
    if version - v > max_staleness:
      dropped += 1
    else:
      buffer.append((c, version - v))
    if len(buffer) == buffer_size:
      out.append((t, buffer, dropped, downloads))
      version, buffer, dropped, downloads = version + 1, [], 0, []
    heapq.heappush(events, (t + durations[c], c, version))
    downloads.append(c)
  return out


@pytest.mark.slow
def test_event_schedule_matches_the_paper_and_repeats_bit_for_bit(tff_runtime, tmp_path):
  speeds = (1.0, 0.55, 0.3)
  trace = tmp_path / "devices.csv"
  trace.write_text("client_id,compute_speed,down_bps,up_bps,latency_s,availability\n" + "".join(
      f"client_{i:04d},{s},2e6,1e6,0.01,1.0\n" for i, s in enumerate(speeds)))
  rounds = 8
  config = dict(
      BASE, rounds=rounds, clients_per_round=2,
      data={"name": "digits", "num_clients": 3, "partition": "iid", "batch_size": 16},
      algorithm={"name": "fedbuff", "local_steps": 2, "concurrency": 3, "max_staleness": 1},
      system={"seconds_per_example": 0.01,
              "profiles": {"source": "trace", "trace": str(trace)}},
      variants={"first": {}, "again": {}})
  runs = fedsim.run(config, logdir=tmp_path / "runs")
  rows = runs["first"].metrics
  down, up = rows[0]["broadcast_bits_per_client"], rows[0]["aggregate_bits_per_client"]
  durations = [down / 2e6 + 0.01 + 32 * 0.01 / s + up / 1e6 + 0.01 for s in speeds]
  expected = _reference_schedule(durations, 2, 1, rounds)
  assert sum(r["staleness/dropped"] for r in rows) > 0  # the schedule exercises dropping
  name = "client_{:04d}".format
  clients = _clients_csv(runs["first"].run_dir)
  assert len(clients) == rounds
  for row, ids, (t, buffered, dropped, downloads) in zip(rows, clients, expected):
    ages = [s for _, s in buffered]
    np.testing.assert_allclose(row["simulated_seconds"], t, rtol=1e-12)
    assert row["staleness/mean"] == np.mean(ages) and row["staleness/max"] == max(ages)
    assert row["staleness/dropped"] == dropped and row["clients/dispatched"] == len(downloads)
    assert row["broadcast_bits"] == len(downloads) * down
    assert row["aggregate_bits"] == (2 + dropped) * up
    assert ids["sampled"] == " ".join(name(c) for c in downloads)
    assert ids["aggregated"] == " ".join(name(c) for c, _ in buffered)
    assert ids["staleness"] == " ".join(str(s) for _, s in buffered)
  assert any(ids["staleness"] != "0 0" for ids in clients)
  np.testing.assert_allclose(rows[-1]["server_updates_per_hour"],
                             rounds * 3600 / expected[-1][0], rtol=1e-12)
  _same(runs["first"], runs["again"])
  strip = lambda rs: [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rs]
  assert strip(rows) == strip(runs["again"].metrics)

