"""A finished 2-variant comparison as a real TensorBoard server shows it,
read through the HTTP data API its web pages use (runs, tags, the custom-scalars
layout, images, the HParams table)."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

import fedsim
from fedsim import cli
from fedsim.reporting.board_tags import board_tag

CONFIG = {
    "name": "board", "seed": 0, "rounds": 2, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 6, "partition": "iid", "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg"},
    "eval": {"every": 1},
    "variants": {
        "none": {},
        "uniform8": {"compression": {"aggregation": {"encoder": "uniform", "bits": 8,
                                                     "min_elements": 10}}},
    },
}
VARIANTS = ("none", "uniform8")
LOAD_SECONDS = 120  # bound on TensorBoard's first load of the logdir (a few seconds)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def experiment(tff_runtime, tmp_path_factory):
  """The finished comparison, after `fedsim compare --target` (the lowest final
  accuracy of the two variants, which both reach)."""
  logdir = tmp_path_factory.mktemp("board")
  fedsim.run(CONFIG, logdir=logdir)
  experiment = logdir / "board"
  assert cli.main(["compare", str(experiment), "--target", str(_target(experiment))]) == 0
  return experiment


def _target(experiment) -> float:
  return min(float(_rows(experiment, run)[-1]["eval/accuracy"]) for run in VARIANTS)


@pytest.fixture(scope="module")
def server(experiment, tmp_path_factory):
  """The base URL of one TensorBoard serving `experiment` on 127.0.0.1; the
  server is killed (its whole process group) whatever the tests did."""
  log = tmp_path_factory.mktemp("tensorboard") / "tensorboard.log"
  with open(log, "wb") as out:
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(experiment),
         "--host", "127.0.0.1", "--port", "0", "--load_fast", "false"],
        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        start_new_session=True)
  try:
    url = _wait_for_url(process, log)
    _poll(lambda: sorted(_get(url, "/data/runs")) == ["comparison", *VARIANTS]
          and _session_groups(url) and len(_session_groups(url)) == 2)
    yield url
  finally:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert not _group_alive(process.pid), "a TensorBoard process was left behind"


def _wait_for_url(process, log) -> str:
  deadline = time.monotonic() + LOAD_SECONDS
  while time.monotonic() < deadline:
    found = re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text(errors="replace"))
    if found:
      return f"http://127.0.0.1:{found.group(1)}"
    assert process.poll() is None, log.read_text(errors="replace")
    time.sleep(0.5)
  raise AssertionError(f"TensorBoard printed no address: {log.read_text(errors='replace')}")


def _poll(ready) -> None:
  deadline = time.monotonic() + LOAD_SECONDS
  while not ready():
    assert time.monotonic() < deadline, "TensorBoard did not load the logdir in time"
    time.sleep(1)


def _group_alive(pgid: int) -> bool:
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        if os.getpgid(int(entry)) == pgid:
          return True
      except ProcessLookupError:
        pass
  return False


def _get(url: str, path: str, **query):
  with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(query)}",
                              timeout=30) as response:
    return json.loads(response.read())


def _post(url: str, path: str, body: dict):
  request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                   headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(request, timeout=30) as response:
    return json.loads(response.read())


def _session_groups(url: str) -> list[dict]:
  return _post(url, "/data/plugin/hparams/session_groups", {
      "startIndex": 0, "sliceSize": 100, "aggregationType": "AGGREGATION_AVG",
      "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
                          "STATUS_RUNNING"]}).get("sessionGroups", [])


def _rows(experiment, run: str) -> list[dict[str, str]]:
  with open(experiment / run / "metrics.csv", encoding="utf-8") as f:
    return list(csv.DictReader(f))


def _expected(experiment, run: str) -> dict[str, list[tuple[int, float]]]:
  """(step, eval accuracy) per accuracy tag, computed from metrics.csv's
  per-round bit columns, not from fedsim's cumulative ones."""
  rows, bits, points = _rows(experiment, run), 0, {}
  for row in rows:
    bits += int(row["broadcast_bits"]) + int(row["aggregate_bits"])
    accuracy = float(row["eval/accuracy"])
    points.setdefault("eval/accuracy", []).append((int(row["round"]), accuracy))
    points.setdefault("eval/accuracy_by_bits", []).append((bits, accuracy))
  return points


def test_one_run_per_variant_plus_the_comparison_run(server):
  assert sorted(_get(server, "/data/runs")) == ["comparison", "none", "uniform8"]


def test_accuracy_by_round_and_bits_are_tags_of_each_variant_by_time_only_with_links(
    server, experiment):
  tags = _get(server, "/data/plugin/scalars/tags")
  for run in VARIANTS:
    expected = _expected(experiment, run)
    for tag, points in expected.items():
      got = _get(server, "/data/plugin/scalars/scalars", run=run, tag=tag)
      assert [(step, pytest.approx(value)) for _, step, value in got] == points, (run, tag)
    assert set(expected) <= set(tags[run])
    # No link or device model: simulated time is examples x seconds_per_example.
    assert "eval/accuracy_by_simulated_ms" not in tags[run]
  # A uniform8 upload is about a quarter of an uncompressed one: fewer bits, same rounds.
  assert (_expected(experiment, "uniform8")["eval/accuracy_by_bits"][-1][0]
          < _expected(experiment, "none")["eval/accuracy_by_bits"][-1][0])
  assert not tags.get("comparison")


def test_scalars_open_on_eval_then_bits_sent_with_internals_grouped_below(server, experiment):
  """The Scalars and Time Series tabs group tags by the text before the first '/',
  in name order: every metrics.csv column is a tag; eval/ first, then the HParams
  ranking metrics (final accuracy, total bits, bits to target), then bits sent."""
  tags = _get(server, "/data/plugin/scalars/tags")
  for run in VARIANTS:
    columns = [c for c in _rows(experiment, run)[0] if c != "round"]
    assert set(tags[run]) >= {board_tag(column) for column in columns}
    groups = list(dict.fromkeys(t.split("/", 1)[0]
                                for t in sorted(tags[run], key=lambda t: t.replace("/", "\0"))))
    assert groups == ["eval", "final", "sent", "stages", "system", "train"], groups
    assert "sent/cumulative_aggregate_bits" in tags[run]
    assert any(tag.startswith("stages/aggregation/") for tag in tags[run]) == (run != "none")


def _charts(layout) -> list[tuple[str, list[str]]]:
  """(title, tags) of each chart of a custom-scalars layout: margin charts only."""
  return [(chart["title"], [series["value"] for series in chart["margin"]["series"]])
          for category in layout["category"] for chart in category["chart"]]


def test_custom_scalars_start_with_accuracy_unsmoothed_and_leave_out_a_clock_without_links(
    server):
  layout = _get(server, "/data/plugin/custom_scalars/layout")
  for category in layout["category"]:
    for chart in category["chart"]:  # margin charts: TensorBoard does not smooth them
      assert "multiline" not in chart
      for series in chart["margin"]["series"]:
        assert series["lower"] == series["upper"] == series["value"]
  charts = _charts(layout)
  # TensorBoard 2.14 draws a category's margin charts last first (see the screenshots).
  first = layout["category"][0]["chart"]
  assert [[s["value"] for s in chart["margin"]["series"]] for chart in reversed(first)] == [
      ["eval/accuracy"], ["eval/accuracy_by_bits"]]
  assert not any("simulated" in title or "eval/accuracy_by_simulated_ms" in tags
                 for title, tags in charts)
  tags = _get(server, "/data/plugin/scalars/tags")
  for _, chart_tags in charts:  # each chart draws every variant
    for tag in chart_tags:
      assert all(tag in tags[run] for run in VARIANTS), tag


def test_comparison_figure_is_an_image_of_the_comparison_run(server):
  tags = _get(server, "/data/plugin/images/tags")
  assert list(tags["comparison"]) == ["comparison/accuracy_vs_bits"]
  (image,) = _get(server, "/data/plugin/images/images", run="comparison",
                  tag="comparison/accuracy_vs_bits")
  assert image["step"] == 2  # drawn once both variants had completed
  with urllib.request.urlopen(f"{server}/data/plugin/images/individualImage?"
                              f"{image['query']}", timeout=30) as response:
    assert response.read(8) == b"\x89PNG\r\n\x1a\n"


def test_hparams_table_fills_every_column_and_ranks_by_the_compare_target(server, experiment):
  config = _post(server, "/data/plugin/hparams/experiment", {"experimentName": ""})
  columns = [h["name"] for h in config["hparamInfos"]]
  # The columns that differ come first; 'compression' (null in the baseline) is no column.
  assert set(columns[:3]) == {"compression.aggregation.encoder", "compression.aggregation.bits",
                              "compression.aggregation.min_elements"}
  # The dashboard sorts differing columns first and shows 5: the encoder first (its
  # bits, min_elements, rounding, ... follow from it: the baseline has none).
  differing = [h["name"] for h in config["hparamInfos"] if h.get("differs")]
  assert differing == columns[:len(differing)]
  assert columns[0] == "compression.aggregation.encoder"
  assert all(name.startswith("compression.aggregation.") for name in differing)
  assert "compression" not in columns
  metrics = [m["name"]["tag"] for m in config["metricInfos"]]
  assert metrics[:4] == ["final/eval/accuracy", "final/total_bits", "final/bits_to_target",
                         "final/simulated_seconds_to_target"]

  groups = {g["name"]: g for g in _session_groups(server)}
  assert sorted(groups) == ["none", "uniform8"]
  for group in groups.values():
    assert set(group["hparams"]) == set(columns)  # no blank cell
  assert groups["none"]["hparams"]["compression.aggregation.encoder"] == "identity"
  assert groups["none"]["hparams"]["compression.aggregation.bits"] == "none"
  assert groups["uniform8"]["hparams"]["compression.aggregation.encoder"] == "uniform"
  assert groups["uniform8"]["hparams"]["compression.aggregation.bits"] == 8

  target = _target(experiment)  # as given to `fedsim compare --target`
  (to_target,) = [m for m in config["metricInfos"] if m["name"]["tag"] == "final/bits_to_target"]
  assert f"eval accuracy {target:.4f}, as given to `fedsim compare --target`" in (
      to_target["description"])
  for run in VARIANTS:
    rows = _rows(experiment, run)
    values = {m["name"]["tag"]: m["value"] for m in groups[run]["metricValues"]}
    bits = [int(r["broadcast_bits"]) + int(r["aggregate_bits"]) for r in rows]
    assert values["final/eval/accuracy"] == pytest.approx(float(rows[-1]["eval/accuracy"]))
    # Scalars are float32: exact below 2^24 bits, within 6e-8 above.
    assert values["final/total_bits"] == pytest.approx(sum(bits), rel=6e-8)
    first = next(i for i, r in enumerate(rows) if float(r["eval/accuracy"]) >= target)
    assert values["final/bits_to_target"] == pytest.approx(sum(bits[:first + 1]), rel=6e-8)
    assert values["final/simulated_seconds_to_target"] == pytest.approx(
        float(rows[first]["simulated_seconds"]))
