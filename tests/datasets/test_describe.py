from __future__ import annotations

import numpy as np
import pytest
import yaml

from fedsim.data import Examples, FederatedData
from fedsim.data.describe import label_figure
from fedsim.errors import UserError
from fedsim.describe_data import describe


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


VARIANTS = {
    "name": "dd", "rounds": 1, "clients_per_round": 2, "model": "mlp",
    "data": {"name": "digits", "num_clients": 12, "partition": "dirichlet", "alpha": 0.3},
    "variants": {"skewed": {}, "flat": {"data": {"partition": "iid"}}},
}


def test_describe_a_variant_into_the_experiment_log_dir(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  text = describe(VARIANTS, variant="flat", logdir=tmp_path / "runs")
  # iid: np.array_split of 1,437 training images into 12 gives 9 x 120 and 3 x 119.
  assert "examples per client: min 119, p10 119, median 120, p90 120, max 120" in text
  png = tmp_path / "runs" / "dd" / "label_distribution-flat.png"
  assert text.endswith(f"label plot: {png}")
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing in the cwd
  base = describe(VARIANTS, logdir=tmp_path / "runs")
  assert "examples per client: min 119" not in base  # Dirichlet sizes differ
  assert (tmp_path / "runs" / "dd" / "label_distribution.png").is_file()
  assert base.endswith("variants with other data: flat (describe one with --variant NAME)")


def test_describe_unknown_variant():
  with pytest.raises(UserError) as e:
    describe(VARIANTS, variant="flt")
  assert str(e.value) == ("--variant flt: no such variant (did you mean 'flat'?);"
                          " the config's variants: skewed, flat")


@pytest.mark.parametrize("classes,legend", [(10, True), (30, False)])
def test_label_plot_keys_the_classes(classes, legend):
  from matplotlib import pyplot as plt
  rng = np.random.default_rng(0)
  clients = {f"c{i}": Examples(np.zeros((20, 2), np.float32), rng.integers(0, classes, 20))
             for i in range(3)}
  data = FederatedData(clients, clients["c0"], (2,), classes)
  fig = label_figure(data, title="t")
  try:
    box = fig.axes[0].get_legend()
    if legend:
      assert box.get_title().get_text() == "class"
      assert [t.get_text() for t in box.get_texts()] == [str(k) for k in range(classes)]
    else:
      assert box is None and fig.axes[1].get_ylabel() == "class"  # a colour bar instead
  finally:
    plt.close(fig)


def test_a_set_with_a_variant_changes_that_variants_data_as_in_a_run():
  """`--variant flat --set data.num_clients=6`: the variant's data with 6 clients
  (it was laid over the base config, under the variant's own section)."""
  config = {**VARIANTS, "variants": {"flat": {"data": {"partition": "iid",
                                                         "num_clients": 12}}}}
  text = describe(config, ["data.num_clients=6"], variant="flat")
  assert "clients: 6" in text.splitlines()
  # iid: 1,437 training images into 6 gives 3 x 240 and 3 x 239.
  assert "examples per client: min 239, p10 239, median 239.5, p90 240, max 240" in text


def test_the_eval_hold_out_is_taken_out_of_the_clients_examples_as_in_a_run():
  """`eval.federated: true` moves a fifth of each client's examples to its own test
  split; describe printed the data without it, and no variant turning it on was
  listed as changing the data."""
  config = {**VARIANTS, "variants": {"plain": {}, "held": {"eval": {"federated": True}}}}
  base, held = describe(config).splitlines(), describe(config, variant="held").splitlines()
  assert base[-1] == "variants with other data: held (describe one with --variant NAME)"
  total = lambda lines: int(next(l for l in lines if l.startswith("examples:")).split()[1])
  # digits: 1,437 training images; round(0.2 n) of each client's n held out.
  from fedsim.experiment.config.loader import expand_variants, load_config
  from fedsim.experiment.population import training_data
  (_, run_config), = expand_variants(load_config(config)[1], only="held")
  trained = training_data(run_config)
  assert total(held) == sum(trained.client_size(c) for c in trained.client_ids) < total(base)
  assert total(base) == 1437
  assert held[2].endswith("(and each client's own test split, held out of its training"
                          " examples)")
