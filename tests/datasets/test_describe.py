from __future__ import annotations

import yaml

from fedsim.data.describe import describe


def test_describe_prints_quantiles_and_writes_png(tmp_path):
  config = tmp_path / "c.yaml"
  config.write_text(yaml.safe_dump({
      "name": "d", "rounds": 1, "clients_per_round": 2, "model": "mlp",
      "data": {"name": "digits", "num_clients": 10, "partition": "shards",
               "shards_per_client": 2}}))
  png = tmp_path / "labels.png"
  text = describe(config, ["data.num_clients=8"], png)
  assert text.splitlines() == [
      "dataset: digits (seed 0)",
      "clients: 8",
      "examples: 1437 on clients, 360 held out",
      "input shape: [64], dtype float32; classes: 10",
      "examples per client: min 179, p10 179, median 180, p90 180, max 180",
      "labels per client: min 2, p10 2, median 2.5, p90 4, max 4",
      f"label plot: {png}",
  ]
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_describe_counts_tokens_of_sequence_data(cache_dir, tmp_path):
  config = {"name": "s", "rounds": 1, "clients_per_round": 1, "model": "lstm",
            "data": {"name": "shakespeare", "cache_dir": str(cache_dir), "sequence_length": 20}}
  text = describe(config, [], tmp_path / "s.png")
  assert "clients: 3" in text and "input shape: [20], dtype int32; classes: 90" in text
  assert (tmp_path / "s.png").stat().st_size > 0
