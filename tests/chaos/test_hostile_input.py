"""Non-UTF-8 logs, hostile plugin data and hostile configs: one line each, naming the culprit."""

from __future__ import annotations

import os

import numpy as np
import pytest
import yaml

from fedsim import cli
from fedsim.data.custom import CustomParams, build
from fedsim.errors import UserError
from fedsim.experiment import resume

BASE = {"name": "chaos", "rounds": 2, "clients_per_round": 2,
        "data": {"name": "digits", "num_clients": 4, "partition": "iid", "batch_size": 32},
        "model": {"name": "logistic"},
        "algorithm": {"name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": 0.1}}}


def _run_dir(root, name):
  run_dir = root / "exp" / name
  run_dir.mkdir(parents=True)
  (run_dir / "config.yaml").write_text(yaml.safe_dump({"name": "exp", "rounds": 5}))
  (run_dir / "status").write_text("interrupted\n")
  (run_dir / "metrics.csv").write_text("round,train/loss\n1,0.5\n")
  (run_dir / "clients.csv").write_text("round,client\n1,a\n")
  (run_dir / "events.log").write_text("round 1: ok\n")
  return run_dir


@pytest.mark.parametrize("name", ["metrics.csv", "clients.csv", "events.log", "config.yaml"])
def test_non_utf8_log_is_refused_by_resume_naming_the_file(tmp_path, name):
  run_dir = _run_dir(tmp_path, "a")
  with open(run_dir / name, "ab") as f:
    f.write(b"\xff\xfe\n")
  with pytest.raises(UserError, match=rf"--resume {run_dir}: {run_dir / name} is damaged \(a byte"):
    resume.check_resumable(run_dir, {"name": "exp", "rounds": 5})


@pytest.mark.parametrize("name", ["metrics.csv", "status", "config.yaml"])
def test_non_utf8_file_does_not_hide_the_other_runs(tmp_path, capsys, name):
  bad, good = _run_dir(tmp_path, "a"), _run_dir(tmp_path, "b")
  with open(bad / name, "ab") as f:
    f.write(b"\xff\n")
  cli.main(["status", str(tmp_path)])
  lines = capsys.readouterr().out.splitlines()
  assert lines[1] == f"{good}: interrupted, round 1 of 5, no checkpoint"
  assert lines[0].startswith(f"{bad}: ") and len(lines) == 2
  if name != "config.yaml":  # its rounds are then unknown: 'round 1, no checkpoint'
    assert str(bad / name) in lines[0]


def _clients(**override):
  x = np.ones((3, 2), np.float32)
  clients = {"a": (x, np.array([0, 1, 1])), "b": (x, np.array([1, 0, 0]))}
  clients.update(override)
  return clients


HOSTILE_DATA = {
    "nan": ({"clients": _clients(b=(np.array([[np.nan, 0]] * 3, np.float32), np.zeros(3, int)))},
            "client 'b' has NaN or infinite features"),
    "inf": ({"clients": _clients(a=(np.full((3, 2), np.inf, np.float32), np.zeros(3, int)))},
            "client 'a' has NaN or infinite features"),
    "empty client": ({"clients": _clients(b=(np.zeros((0, 2), np.float32), np.zeros(0, int)))},
                     "client 'b' has no examples"),
    "empty test": ({"test": (np.zeros((0, 2), np.float32), np.zeros(0, int))},
                   "the test set has no examples"),
    "label out of range": ({"clients": _clients(b=(np.ones((3, 2), np.float32), np.array([0, 1, 7])))},
                           "client 'b' has label 7, outside 0..2"),
    "negative label": ({"clients": _clients(b=(np.ones((3, 2), np.float32), np.array([0, -1, 1])))},
                       "client 'b' has label -1, outside 0..2"),
    "shapes differ": ({"clients": _clients(b=(np.ones((3, 5), np.float32), np.zeros(3, int)))},
                      "client 'b' has features of shape (5,), but client 'a' has (2,)"),
    "string labels": ({"clients": _clients(b=(np.ones((3, 2), np.float32), np.array(["x"] * 3)))},
                      "client 'b' has labels of type <U1"),
    "string labels, centralized": ({"train": (np.ones((4, 2), np.float32), np.array(["x"] * 4))},
                                   "'train' has labels of type <U1"),
}


def hostile(seed, case):
  del seed
  made, _ = HOSTILE_DATA[case]
  test = (np.ones((2, 2), np.float32), np.array([0, 1]))
  return {"test": test, **({"clients": _clients()} if "train" not in made else {}), **made}


@pytest.mark.parametrize("case", HOSTILE_DATA)
def test_hostile_plugin_data_is_one_line_naming_dataset_and_part(case):
  builder = f"{__name__}:hostile"
  params = CustomParams(builder=builder, args={"case": case}, num_clients=2, num_classes=3)
  with pytest.raises(UserError) as raised:
    build(params, seed=0)
  message = str(raised.value)
  assert message.startswith(f"data.builder: {builder}: ") and "\n" not in message
  assert HOSTILE_DATA[case][1] in message


def _validate(tmp_path, capsys, text, name="c.yaml"):
  path = tmp_path / name
  path.write_text(text)
  code = cli.main(["validate", str(path)])
  return code, capsys.readouterr().err.splitlines()


def test_an_alias_bomb_under_data_args_is_refused(tmp_path, capsys):
  lines = ["laugh0: &l0 [ha, ha, ha, ha, ha, ha, ha, ha, ha, ha]"]
  lines += [f"laugh{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
  bomb = yaml.safe_dump(BASE) + "\n".join(lines) + "\n"  # 10^9 strings once expanded
  code, err = _validate(tmp_path, capsys, bomb)
  assert code == 2 and len(err) == 1
  assert err[0].startswith(f"fedsim: error: {tmp_path / 'c.yaml'}: line 1 not valid YAML: more"
                           " than 1,000,000 values once its aliases")


def test_deeply_nested_yaml_is_refused(tmp_path, capsys):
  code, err = _validate(tmp_path, capsys, "a: " + "[" * 5000 + "]" * 5000 + "\n")
  assert code == 2 and err == [f"fedsim: error: {tmp_path / 'c.yaml'}: line 1 not valid YAML:"
                               " nested more than 100 levels deep"]


def test_a_50_mb_config_is_refused_unread(tmp_path, capsys):
  path = tmp_path / "big.yaml"
  with open(path, "wb") as f:
    f.truncate(50 << 20)  # sparse: its size is what is checked
  assert cli.main(["validate", str(path)]) == 2
  assert capsys.readouterr().err.splitlines() == [
      f"fedsim: error: {path}: 50.0 MiB; a config file is at most 1 MiB (put data in a dataset"
      " file)"]


def test_a_plugin_that_is_not_python_is_one_line(tmp_path, capsys):
  code, err = _validate(tmp_path, capsys, yaml.safe_dump({**BASE, "plugins": ["/etc/passwd"]}))
  assert code == 2 and err == ["fedsim: error: plugins[0]: /etc/passwd: not a Python file"
                               " (a plugin file ends in .py)"]


def test_a_plugin_outside_the_config_directory_is_allowed(tmp_path, capsys):
  (tmp_path / "outside.py").write_text("LOADED = True\n")
  (tmp_path / "configs").mkdir()
  code, err = _validate(tmp_path, capsys, yaml.safe_dump({**BASE, "plugins": ["../outside.py"]}),
                        name="configs/c.yaml")
  assert code == 0 and err == []


@pytest.mark.parametrize("override, message", [
    ("rounds=0", "rounds: must be >= 1, got 0"),
    ("clients_per_round=10000", "clients_per_round: 10000 is larger than data.num_clients (4)"),
])
def test_impossible_sizes_are_one_line(tmp_path, capsys, override, message):
  path = tmp_path / "c.yaml"
  path.write_text(yaml.safe_dump(BASE))
  assert cli.main(["validate", str(path), "--set", override]) == 2
  assert capsys.readouterr().err.splitlines() == [f"fedsim: error: {message}"]


@pytest.mark.slow
@pytest.mark.parametrize("limit_kib", [1_000_000, 2_000_000])
def test_too_little_address_space_is_one_line_and_no_run_left(tmp_path, limit_kib):
  import subprocess
  import sys
  path = tmp_path / "c.yaml"
  path.write_text(yaml.safe_dump(BASE))
  done = subprocess.run(
      ["bash", "-c", f'ulimit -v {limit_kib}; exec "$0" -m fedsim.cli run "$1" --logdir "$2"',
       sys.executable, str(path), str(tmp_path / "logs")],
      capture_output=True, text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert done.returncode == 2
  assert done.stderr.splitlines() == [
      f"fedsim: error: ulimit -v: this process may map {limit_kib / 2**20:.1f} GiB; TensorFlow"
      " needs at least 3 GiB (raise the limit with ulimit -v)"]
  assert not (tmp_path / "logs").exists()  # no run directory left 'running'


def test_a_tff_file_with_a_label_out_of_range_fails_the_run_in_one_line(
    tff_runtime, tmp_path, capsys):
  """Clients load lazily, so the label is found mid-run: one line naming the file and
  the client, status `failed` (it was a TensorFlow traceback from the loss)."""
  from fedsim.reporting import read_status
  from tests.datasets import tff_sqlite
  rows = tff_sqlite.emnist_rows()
  rows[0] = (rows[0][0], rows[0][1], tff_sqlite.example(
      {"pixels": np.zeros((28, 28), np.float32), "label": 10}))  # client f0000_00, train
  path = tff_sqlite.write(tmp_path / "emnist_all.sqlite", rows)
  config = tmp_path / "c.yaml"
  config.write_text(yaml.safe_dump(dict(
      BASE, clients_per_round=3,
      data={"name": "emnist", "cache_dir": str(tmp_path), "batch_size": 4})))
  code = cli.main(["run", str(config), "--logdir", str(tmp_path / "runs")])
  message = (f"data.cache_dir: {path}: client 'f0000_00' has label 10, outside 0..9;"
             " is it the file TFF publishes?")
  assert (code, capsys.readouterr().err.splitlines()) == (2, [f"fedsim: error: {message}"])
  (run_dir,) = [p for p in (tmp_path / "runs" / "chaos").iterdir() if p.is_dir()]
  assert read_status(run_dir) == ("failed", message)


def test_one_client_with_a_batch_larger_than_its_data_runs_normally(tff_runtime, tmp_path):
  """The whole client is one batch: each round trains on all its examples once."""
  import fedsim
  from fedsim.config.typed import parse as parse_params
  from fedsim.data import DATASETS
  data = {"name": "digits", "num_clients": 1, "batch_size": 100_000}
  result = fedsim.run(dict(BASE, clients_per_round=1, data=data), logdir=tmp_path / "runs",
                      progress=False)
  entry = DATASETS.get("digits")
  built = entry.build(parse_params(entry.params, {k: v for k, v in data.items() if k != "name"},
                                   "data"), BASE.get("seed", 0))
  (examples,) = [len(built.clients[c].y) for c in built.client_ids]
  assert examples > 1000  # the one client holds the training split
  assert [m["train/num_examples"] for m in result.metrics] == [float(examples)] * 2
  assert [m["clients/aggregated"] for m in result.metrics] == [1, 1]
