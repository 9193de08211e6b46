"""End-to-end: the `fedsim` command on tiny data, as a user runs it."""

from __future__ import annotations

import csv
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from fedsim.errors import UserError

TINY = """
name: tiny
seed: 3
rounds: 2
clients_per_round: 3
data: {name: digits, num_clients: 6, partition: dirichlet, alpha: 0.5, batch_size: 16}
model: {name: mlp, hidden: [16]}
algorithm:
  name: fedavg
  client_optimizer: {name: sgd, learning_rate: 0.2}
eval: {every: 1}
"""


def fedsim(*args, cwd=None, timeout=300):
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  return subprocess.run([sys.executable, "-m", "fedsim.cli", *args], cwd=cwd, env=env,
                        stdin=subprocess.DEVNULL, capture_output=True, text=True,
                        timeout=timeout)


@pytest.fixture
def tiny_config(tmp_path):
  path = tmp_path / "tiny.yaml"
  path.write_text(TINY)
  return path


@pytest.mark.slow
def test_run_writes_logs_and_prints_where(tmp_path, tiny_config):
  logdir = tmp_path / "runs"
  result = fedsim("run", str(tiny_config), "--logdir", str(logdir), "--set", "rounds=2")
  assert result.returncode == 0, result.stderr
  assert "Traceback" not in result.stderr
  assert f"tensorboard --logdir {logdir / 'tiny'}" in result.stdout
  (run_dir,) = [p for p in (logdir / "tiny").iterdir() if (p / "config.yaml").is_file()]
  names = {p.name for p in run_dir.iterdir()}
  assert {"config.yaml", "metrics.csv", "status", "worker.log"} <= names
  assert any(n.startswith("events.out.tfevents") for n in names)
  assert (run_dir / "status").read_text().split()[0] == "completed"
  rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
  assert [r["round"] for r in rows] == ["1", "2"]
  for column in ["train/loss", "train/accuracy", "eval/loss", "eval/accuracy", "round_seconds",
                 "broadcast_bits", "aggregate_bits", "cumulative_broadcast_bits",
                 "cumulative_aggregate_bits", "clients/sampled"]:
    assert rows[-1][column] != "", column
  params = 64 * 16 + 16 + 16 * 10 + 10
  assert int(rows[0]["broadcast_bits"]) == 3 * params * 32
  assert int(rows[1]["cumulative_broadcast_bits"]) == 2 * 3 * params * 32
  resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
  assert resolved["data"]["alpha"] == 0.5 and resolved["eval"]["batch_size"] == 256
  # Per round, as TFF's compression tutorial prints it: 3 clients get the float32 model.
  from fedsim.reporting import format_bits
  model_bits = format_bits(3 * params * 32)
  assert f"per round: broadcast {model_bits} (model {model_bits}), aggregate " in result.stdout
  assert f"(model {model_bits}); mean of 2 rounds" in result.stdout


@pytest.mark.slow
# Two more CLI processes (~30 s): the default run keeps both properties in
# resume/test_live_runs.py (a second process of the same config equals the first
# bit for bit) and resume/test_faults.py (a fresh run gets its own directory).
@pytest.mark.long
def test_a_second_run_gets_its_own_directory_and_the_same_metrics(tmp_path, tiny_config):
  logdir = tmp_path / "runs"
  for _ in range(2):
    result = fedsim("run", str(tiny_config), "--logdir", str(logdir))
    assert result.returncode == 0, result.stderr
  runs = sorted(p for p in (logdir / "tiny").iterdir() if (p / "config.yaml").is_file())
  assert len(runs) == 2
  first, second = (list(csv.DictReader(open(run / "metrics.csv"))) for run in runs)
  assert [r["round"] for r in first] == ["1", "2"]
  for a, b in zip(first, second, strict=True):  # same config + seed -> same metrics
    for key in ("train/loss", "eval/accuracy", "eval/loss"):
      assert a[key] == b[key], key


@pytest.mark.parametrize("args,culprit", [
    (["--set", "clients_per_round=100"], "clients_per_round"),
    (["--set", "model.name=cnnn"], "did you mean 'cnn'"),
    (["--set", "algorithm.client_optimizer.learning_rate=-1"], "learning_rate"),
    (["--set", "data.num_clients=x"], "data.num_clients"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, tiny_config, args, culprit):
  result = fedsim("run", str(tiny_config), "--logdir", str(tmp_path / "runs"), *args)
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and culprit in lines[0] and lines[0].startswith("fedsim: error:")
  assert not (tmp_path / "runs").exists()  # nothing was started


@pytest.mark.slow
def test_check_prints_its_table_and_nothing_else():
  """TensorFlow's start-up lines and tensor_encoding's notes stay off the
  terminal, as in a run (the suite's TF_CPP_MIN_LOG_LEVEL is not a user's)."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  result = subprocess.run([sys.executable, "-m", "fedsim.cli", "check", "encoder", "uniform"],
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr
  assert result.stderr == ""
  assert result.stdout.splitlines()[-1] == "uniform: its random draws repeat (seeded)"


def test_missing_config_file(tmp_path):
  result = fedsim("validate", str(tmp_path / "missing.yaml"))
  assert result.returncode == 2
  assert result.stderr.strip() == f"fedsim: error: {tmp_path / 'missing.yaml'}: config file not found"


def test_validate_ok(tiny_config):
  result = fedsim("validate", str(tiny_config))
  assert result.returncode == 0
  assert result.stdout.strip() == f"{tiny_config}: ok (1 run: tiny)"


def test_help_lists_options():
  out = fedsim("run", "--help").stdout
  for option in ("--set", "--logdir", "CONFIG.yaml"):
    assert option in out


def test_list_shows_typed_parameters_and_summaries(capsys):
  from fedsim import cli
  assert cli.main(["list", "encoder"]) == 0
  lines = capsys.readouterr().out.splitlines()
  # Names are padded to the longest encoder's: compare with single spaces.
  squeezed = [" ".join(line.split()) for line in lines]
  assert "encoder uniform bits: int = 8, rounding: stochastic|deterministic = stochastic" in squeezed
  assert lines[squeezed.index("encoder identity (no parameters)") + 1] == (
      "    Sends tensors unchanged (32 bits per float32 element).")
  assert all(line.startswith(("encoder ", "    ")) for line in lines)
  assert cli.main(["list", "optimizers"]) == 0  # plural and case are forgiven
  assert "optimizer sgd      learning_rate: float = 0.1, momentum: float = 0.0" in (
      capsys.readouterr().out.splitlines())


def test_list_everything_without_tensorflow(tmp_path):
  (tmp_path / "listed_plugin.py").write_text(
      "from fedsim.learning.optimizers import OPTIMIZERS, SgdParams\n"
      "@OPTIMIZERS.register('plugin_listed_sgd', params=SgdParams)\n"
      "def build(p):\n  '''An optimizer from a plugin.'''\n")
  code = ("import sys\nfrom fedsim import cli\n"
          "code = cli.main(['list', '--plugin', 'listed_plugin.py'])\n"
          "assert not [m for m in sys.modules if m.split('.')[0] in"
          " ('tensorflow', 'tensorflow_federated', 'keras')], 'TF imported'\n"
          "sys.exit(code)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  groups = [block.splitlines()[0].split()[0] for block in result.stdout.split("\n\n")]
  assert {"algorithm", "dataset", "encoder", "model", "optimizer", "partition"} <= set(groups)
  assert "optimizer plugin_listed_sgd  learning_rate: float = 0.1, momentum: float = 0.0\n" \
         "    An optimizer from a plugin." in result.stdout


def test_run_without_config_resumes_a_run_directory(tmp_path, capsys):
  import argparse
  from fedsim import cli
  assert cli.main(["run", "--logdir", str(tmp_path)]) == 2
  assert capsys.readouterr().err == ("fedsim: error: run: CONFIG.yaml is required, unless"
                                     " --resume [DIR] continues runs\n")
  assert cli.main(["run", "--resume", str(tmp_path)]) == 2
  assert capsys.readouterr().err == (f"fedsim: error: --resume {tmp_path}: not a fedsim run"
                                     " or study directory (no config.yaml, no study.yaml)\n")
  # `--resume` alone: the newest run under --logdir that did not complete.
  for i, (run, status) in enumerate([("a/1", "interrupted"), ("b/2", "failed"),
                                     ("a/3", "completed")]):
    (tmp_path / run).mkdir(parents=True)
    (tmp_path / run / "config.yaml").write_text("name: x\n")
    (tmp_path / run / "status").write_text(status + "\n")
    os.utime(tmp_path / run / "config.yaml", (1e9 + i, 1e9 + i))
  args = argparse.Namespace(resume=True, logdir=str(tmp_path), seeds=None, variant=None,
                            config=None)
  assert cli._resume_target(args) == tmp_path / "b/2"
  # A live run (its writer, this process, is alive) is passed over, not picked to be refused.
  (tmp_path / "c/4").mkdir(parents=True)
  (tmp_path / "c/4/config.yaml").write_text("name: x\n")
  from fedsim.reporting.rundir import write_status
  write_status(tmp_path / "c/4", "running")
  assert cli._resume_target(args) == tmp_path / "b/2"
  (tmp_path / "b/study.yaml").write_text("runs: [{run: '2', dir: '2'}]\n")
  assert cli._resume_target(args) == tmp_path / "b"  # the study it belongs to
  for run in ("a/1", "b/2"):
    (tmp_path / run / "status").write_text("completed\n")
  with pytest.raises(UserError, match=r"no incomplete run under .* that is not live \(.*c/4"
                                      r" still running\)$"):
    cli._resume_target(args)
  assert cli.main(["run", "--resume", "--logdir", str(tmp_path), "--variant", "v"]) == 2
  assert "--variant: a run directory is one run" in capsys.readouterr().err


def test_list_names_every_registry_by_one_word(capsys):
  from fedsim import cli
  from fedsim.catalog import registries
  names = [r.name for r in registries()]
  assert all(len(name.split()) == 1 for name in names) and len(set(names)) == len(names)
  assert {"aggregation", "broadcast", "speed", "staleness"} <= set(names)
  assert cli.main(["list", "aggregation"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert any(line.startswith("aggregation clip ") for line in lines)
  assert all(line.startswith(("aggregation ", "    ")) for line in lines)
  assert cli.main(["list", "aggregation stage"]) == 0  # the name it had before
  assert capsys.readouterr().out.splitlines() == lines
  assert cli.main(["list", "aggregation", "stage"]) == 0  # unquoted, as the docs print it
  assert capsys.readouterr().out.splitlines() == lines


def test_list_unknown_registry(capsys):
  from fedsim import cli
  assert cli.main(["list", "encodr"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("fedsim: error: list: no registry 'encodr' (did you mean 'encoder'?);")
  assert len(err.splitlines()) == 1


def test_variant_selects_one_run(tmp_path, capsys):
  from fedsim import cli
  path = tmp_path / "v.yaml"
  path.write_text(TINY + "variants: {a: {}, b: {rounds: 1}}\n")
  assert cli.main(["validate", str(path), "--variant", "b"]) == 0
  assert capsys.readouterr().out.strip() == f"{path}: ok (1 run: b)"
  for command in (["validate"], ["run", "--logdir", str(tmp_path / "runs")]):
    assert cli.main([*command[:1], str(path), *command[1:], "--variant", "c"]) == 2
    assert capsys.readouterr().err == (
        "fedsim: error: --variant c: no such variant; the config's variants: a, b\n")
  assert not (tmp_path / "runs").exists()
  assert cli.main(["validate", str(tmp_path / "v.yaml"), "--variant", "a",
                   "--set", "variants={}"]) == 2
  assert "--variant a: the config has no variants" in capsys.readouterr().err


@pytest.mark.slow
def test_run_one_variant(tff_runtime, tmp_path, capsys):
  # In this process (test_run_writes_logs_and_prints_where runs the command as a
  # user does): a second interpreter would import TensorFlow again.
  from fedsim import cli
  path = tmp_path / "v.yaml"
  path.write_text(TINY + "variants: {a: {}, b: {rounds: 1}}\n")
  code = cli.main(["run", str(path), "--logdir", str(tmp_path / "runs"), "--variant", "b",
                   "--no-progress"])
  out, err = capsys.readouterr()
  assert code == 0, err
  runs = (tmp_path / "runs" / "tiny").iterdir()
  assert [p.name for p in runs if (p / "config.yaml").is_file()] == ["b"]
  assert "[b] rounds: 1, final eval/accuracy" in out


@pytest.mark.parametrize("reference,bits,counter,said", [
    (1056, 1056, 0, "uncompressed"),
    # 8-bit uploads, float broadcast: the broadcast gains only the encoder's counter.
    (6_372_096, 6_372_128, 32, "uncompressed + 32 bits of round counter"),
    (6_372_096, 6_372_160, 0, "uncompressed +64 bits"),
    (6_372_096, 1_820_640, 0, "3.50x fewer bits than uncompressed"),
    (1056, 2112, 0, "2.00x more bits than uncompressed"),
])
def test_summary_never_says_one_x_fewer_bits(reference, bits, counter, said):
  from fedsim.reporting.summary import vs_uncompressed
  assert vs_uncompressed(reference, bits, counter_bits=counter) == said


def test_every_flag_is_in_the_command_line_reference_table():
  import re
  from fedsim import cli
  page = (pathlib.Path(__file__).resolve().parents[2] / "docs/reference/cli.md").read_text()
  table = {cell for row in re.findall(r"^\| (`[^|]*(?:\\\|[^|]*)*`) \|", page, re.M)
           for cell in re.findall(r"`(-[-\w]+)", row)}

  def flags(parser):
    for action in parser._actions:  # pylint: disable=protected-access
      yield from action.option_strings
      for sub in getattr(action, "choices", None) or {}:
        if isinstance(action.choices[sub], type(parser)):
          yield from flags(action.choices[sub])
  assert set(flags(cli._parser())) == table  # every flag, and no flag fedsim lacks


@pytest.mark.parametrize("args,said", [
    (["data", "describe", "c.yaml", "--png", "x.txt"],
     "argument --png: 'x.txt' is not a .png file's path, e.g. labels.png"),
    (["data", "describe", "c.yaml", "--png", ""],
     "argument --png: '' is not a .png file's path, e.g. labels.png"),
    (["data", "describe", "c.yaml", "--png", "p.png", "--logdir", "d"],
     "argument --logdir: not allowed with argument --png"),
    (["compare", "runs/x", "--target", "90"],
     "argument --target: '90' is not an accuracy in (0, 1], e.g. 0.9 for 90%"),
    (["compare", "runs/x", "--target", "nan"],
     "argument --target: 'nan' is not an accuracy in (0, 1], e.g. 0.9 for 90%"),
    (["compare", "runs/x", "--target", "0"],
     "argument --target: '0' is not an accuracy in (0, 1], e.g. 0.9 for 90%"),
    (["compare", "runs/x", "--target", "90%"],
     "argument --target: '90%' is not an accuracy in (0, 1], e.g. 0.9 for 90%"),
    (["run", "c.yaml", "--jobs", "two"], "argument --jobs: 'two' is not a positive integer"),
    (["run", "c.yaml", "--jobs", "0"], "argument --jobs: '0' is not a positive integer"),
    (["validate", "c.yaml", "--seeds=-1"], "argument --seeds: '-1' is not a comma-separated"
                                           " list of seeds (integers >= 0), e.g. 0,1,2"),
    (["validate", "c.yaml", "--seeds", "1_0"], "argument --seeds: '1_0' is not a"
                                               " comma-separated list of seeds (integers >= 0),"
                                               " e.g. 0,1,2"),
    (["validate", "c.yaml", "--seeds", "1,1"], "argument --seeds: '1,1' repeats a seed"),
    (["run", "c.yaml", "--seeds", "2147483648"],
     "argument --seeds: 2147483648 is beyond the largest seed, 2**31 - 1"),
])
def test_a_flags_bad_value_is_refused_naming_the_flag(args, said, capsys):
  from fedsim import cli
  with pytest.raises(SystemExit) as exit_:
    cli.main(args)
  assert exit_.value.code == 2
  command = " ".join(["fedsim", *args[:2 if args[0] == "data" else 1]])
  # One line, as fedsim's own errors (argparse printed its usage block above it).
  assert capsys.readouterr().err == f"{command}: error: {said} (see {command} --help)\n"


def test_a_file_where_a_directory_belongs_is_named_as_such(tmp_path, tiny_config, capsys,
                                                           monkeypatch):
  from fedsim import cli
  monkeypatch.chdir(tmp_path)
  (tmp_path / "afile").write_text("")
  for args, said in [
      (["status", "afile"], "afile: not a directory"),
      (["run", "--resume", "afile"], "--resume afile: not a directory"),
      (["run", str(tiny_config), "--logdir", "afile"], "--logdir afile: not a directory"),
      (["data", "describe", str(tiny_config), "--logdir", "afile"],
       "--logdir afile: not a directory"),
      (["run", str(tiny_config), "--logdir", "afile/runs"],
       "--logdir afile/runs: not a directory (afile is a file)"),
      (["validate", str(tiny_config), "--seeds", "1", "--set", "seeds=[2,3]"],
       "--seeds 1 and --set seeds=[2,3]: give the seeds once"),
  ]:
    assert cli.main(args) == 2, args
    assert capsys.readouterr().err == f"fedsim: error: {said}\n"
  for args, said in [
      (["data", "describe", str(tiny_config), "--png", "afile/x.png"],
       "argument --png: 'afile/x.png': afile is a file, not a directory"),
      (["data", "describe", str(tiny_config), "--png", "afile/sub/x.png"],
       "argument --png: 'afile/sub/x.png': afile is a file, not a directory"),
  ]:
    with pytest.raises(SystemExit) as exit_:
      cli.main(args)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"fedsim data describe: error: {said}"
                                       " (see fedsim data describe --help)\n")
  (tmp_path / "plots.png").mkdir()
  with pytest.raises(SystemExit):
    cli.main(["data", "describe", str(tiny_config), "--png", "plots.png"])
  assert "'plots.png' is a directory, not a .png file" in capsys.readouterr().err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "plots.png", "tiny.yaml"]


def test_a_run_whose_config_is_refused_at_its_build_is_failed_with_why(tmp_path, tiny_config,
                                                                        capsys):
  """It stayed 'not started', with no reason; the resume stays offered (what a
  build refuses may be the machine's to mend: a data file, a GPU)."""
  from fedsim import cli
  logdir = tmp_path / "runs"
  assert cli.main(["run", str(tiny_config), "--logdir", str(logdir),
                   "--set", "data.num_clients=5000"]) == 2
  why = "data.num_clients: 5000 clients need at least 5000 examples, digits has 1437 for training"
  assert capsys.readouterr().err == f"fedsim: error: {why}\n"
  assert cli.main(["status", str(logdir / "tiny")]) == 0
  table = capsys.readouterr().out.splitlines()
  assert len(table) == 3  # the header, the run, `resume with`
  assert table[1].split()[1:3] == ["failed", "0/2"]
  assert table[1].endswith(why)
  assert table[2].startswith("resume with: ")
