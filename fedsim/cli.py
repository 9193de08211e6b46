"""The `fedsim` command line.

Exit codes: 0 success, 1 a run that failed (divergence, dead runtime) or the
machine refused (a full disk), 2 bad input (one line on stderr naming the
culprit), 130 interrupted.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
from typing import NoReturn, Sequence

from fedsim import host_limits
from fedsim.errors import HostError, RunFailed, UserError, host_error, one_line
from fedsim.plugins import load_plugins
from fedsim.seeds import MAX_SEED


class _Words(argparse.Action):
  """A positional of several words kept as one name ('aggregation stage'), None if none."""

  def __call__(self, parser, namespace, values, option_string=None):
    setattr(namespace, self.dest, " ".join(values) or None)


class _Parser(argparse.ArgumentParser):
  """argparse's parser whose errors are one line, as fedsim's own: the usage
  block it prints above them is left to --help."""

  def error(self, message: str) -> NoReturn:
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
  parser = _Parser(
      prog="fedsim",
      description="Federated learning simulation on TensorFlow Federated, measuring"
                  " accuracy and the bits that cross the wire.")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")
  sub.required = True

  def add_config_args(p, config_help="experiment config file", optional=False):
    p.add_argument("config", metavar="CONFIG.yaml", help=config_help,
                   nargs="?" if optional else None)
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="override a config key with a typed YAML value, e.g."
                        " --set rounds=3 --set data.alpha=0.1 (repeatable)")
    p.add_argument("--variant", metavar="NAME",
                   help="only this variant of the config (see its `variants:`)")
    add_plugin_arg(p)

  def add_seeds_arg(p):
    p.add_argument("--seeds", type=_seed_list, default=None, metavar="N,N,...",
                   help="run every variant once per seed, e.g. --seeds 0,1,2 (the config's"
                        " `seeds:`; runs are named <variant>-seed<N>)")

  def add_plugin_arg(p):
    p.add_argument("--plugin", dest="plugins", action="append", default=[],
                   metavar="MODULE|FILE.py",
                   help="import a module or .py file (relative to the working directory)"
                        " before anything else, for the models, encoders, ... it"
                        " registers (repeatable; configs can also list `plugins:`)")

  run = sub.add_parser("run", help="run an experiment's study (all its variants x seeds)",
                       description="Run an experiment's study: every run (variant x seed),"
                                   " planned in <logdir>/<name>/study.yaml, each into"
                                   " <logdir>/<name>/<run>/ with metrics.csv, TensorBoard"
                                   " events and config.yaml.")
  add_config_args(run, "experiment config file; left out with --resume, the run's own"
                       " config.yaml (RUN_DIR's, or the newest incomplete run's under"
                       " --logdir)", optional=True)
  add_seeds_arg(run)
  run.add_argument("--logdir", default="runs", help="root directory of runs (default: runs)")
  run.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is off anyway when stdout is not a terminal)")
  run.add_argument("--jobs", type=_positive_int, default=1, metavar="N",
                   help="play N runs of the study at once, each a process on its share of"
                        " the CPUs (default: 1, one after another in this process)")
  run.add_argument("--executor", metavar="NAME",
                   help="what plays the study's runs: sequential (the default), processes"
                        " (the default with --jobs N > 1) or ray (each run a Ray task)")
  run.add_argument("--ray-address", metavar="ADDR",
                   help="with --executor ray: local (a Ray instance fedsim starts and"
                        " stops; the default), auto (the one `ray start` made here) or"
                        " HOST:PORT of a cluster's head")
  run.add_argument("--max-retries", type=int, metavar="N",
                   help="with --executor ray: start a run again, from its last checkpoint,"
                        " up to N times when its worker or node is lost (default: 2)")
  start = run.add_mutually_exclusive_group()
  start.add_argument("--resume", nargs="?", const=True, default=None, metavar="DIR",
                     help="continue the study: complete runs are left alone, interrupted"
                          " ones continue from their checkpoints, the others start. DIR: a"
                          " study (<logdir>/<name>) or one run directory; without DIR,"
                          " CONFIG's study, or without CONFIG the newest incomplete run's;"
                          " without this flag every run starts a new directory")
  start.add_argument("--fresh", action="store_true",
                     help="start a new run directory (the default; nothing is deleted)")

  validate = sub.add_parser("validate", help="check a config without running it",
                            description="Validate a config and its variants; exit 2 with"
                                        " the offending key if anything is wrong.")
  add_config_args(validate)
  add_seeds_arg(validate)

  listing = sub.add_parser("list", help="what a config can name, with parameters",
                           description="Print every registry's entries (models, datasets,"
                                       " algorithms, encoders, ...) with their typed"
                                       " parameters and defaults, and the summary line of"
                                       " each entry's docstring.")
  listing.add_argument("registry", nargs="*", action=_Words, metavar="REGISTRY",
                       help="only this registry, e.g. encoder or model (words of one name,"
                            " as 'aggregation stage', may come unquoted)")
  add_plugin_arg(listing)

  compare = sub.add_parser("compare", help="compare the runs of an experiment",
                           description="Print a table of an experiment's runs (final eval"
                                       " accuracy, total bits each way, ratio vs. an"
                                       " uncompressed run; per variant over seeds, the"
                                       " mean and 95% interval) and write"
                                       " accuracy_vs_bits.png and accuracy_vs_rounds.png,"
                                       " and the table over seeds as study_result.md and"
                                       " study_result.csv, into the experiment directory.")
  compare.add_argument("--target", type=_accuracy, default=None, metavar="ACCURACY",
                       help="also show where each run first reached this eval accuracy:"
                            " its round, cumulative bits both ways and simulated hours;"
                            " TensorBoard's HParams tab then ranks 'to target' by it too")
  compare.add_argument("--budget", default=None, metavar="BITS",
                       help="also show each run's best eval accuracy among evaluations made"
                            " with at most this many bits sent both ways (e.g. 64Mibit, 5e6)")
  compare.add_argument("--wide", action="store_true",
                       help="every column in one table, however wide (by default a table"
                            " fits 120 columns: entropy-coded totals are left out and the"
                            " columns wrap into blocks)")
  compare.add_argument("experiment_dir", metavar="DIR",
                       help="experiment directory holding run directories, e.g. runs/<name>")

  status = sub.add_parser("status", help="what happened to runs: status, round, checkpoint",
                          description="For a study (<logdir>/<name>), one table: a row per"
                                      " run with its state, round reached, last metric, pid"
                                      " while running and why it stopped, then the command"
                                      " that resumes it when one can succeed. Otherwise one"
                                      " line per run directory: its status and why, the last"
                                      " round logged, and the checkpoint a --resume would"
                                      " continue from.")
  status.add_argument("path", nargs="?", default="runs", metavar="DIR",
                      help="a run directory, an experiment directory (runs/<name>) or the"
                           " log directory (default: runs)")

  data = sub.add_parser("data", help="inspect an experiment's federated data",
                        description="Inspect the federated data a config builds.")
  data_sub = data.add_subparsers(dest="data_command", metavar="ACTION")
  data_sub.required = True
  describe = data_sub.add_parser(
      "describe", help="clients, examples and labels per client, and a label plot",
      description="Print the number of clients, quantiles of examples and of distinct"
                  " labels per client, and write a label-distribution PNG.")
  add_config_args(describe)
  where = describe.add_mutually_exclusive_group()
  where.add_argument("--png", default=None, type=_png_path, metavar="PATH.png",
                     help="where to write the plot (default: the experiment's log"
                          " directory, <logdir>/<name>/label_distribution.png)")
  where.add_argument("--logdir", default="runs",
                     help="root directory of runs (default: runs)")
  _add_check_parser(sub, add_plugin_arg)
  return parser


def _positive_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"'{text}' is not a positive integer")
  return value


def _add_check_parser(sub, add_plugin_arg) -> None:
  check = sub.add_parser("check", help="check that a component keeps its contract",
                         description="Check a registered component on seeded test inputs.")
  check_sub = check.add_subparsers(dest="check_command", metavar="KIND")
  check_sub.required = True
  encoder = check_sub.add_parser(
      "encoder", help="encode and decode test vectors; is the sum the sum of the decodes?",
      description="Encode and decode seeded test vectors (Gaussian, heavy-tailed, sparse;"
                  " odd sizes) and a sum over 4 clients, and print per vector: vNMSE,"
                  " bias z-score, bits per coordinate vs float32, and whether the sum"
                  " decodes as the sum of the decodes. Exit 1 if it does not.")
  encoder.add_argument("name", metavar="NAME", help="a registered encoder (see fedsim list"
                                                    " encoder), a plugin's included")
  encoder.add_argument("params", nargs="*", default=[], metavar="KEY=VALUE",
                       help="encoder parameters as YAML values, e.g. bits=4")
  add_plugin_arg(encoder)


def _check(args) -> int:
  from fedsim.experiment.config.merge import parse_set
  params = {}
  for item in args.params:
    key, sep, _ = item.partition("=")
    if not sep or not key.strip() or "." in key:
      raise UserError(f"{item}: expected KEY=VALUE, a parameter of encoder '{args.name}'")
    if key.strip() in params:  # as a config refuses a key given twice
      raise UserError(f"{item}: {key.strip()} is given twice")
    params.update(parse_set(item, flag=""))
  from fedsim.backend import quiet
  # As a run does: TensorFlow's start-up lines, its C++ warnings and
  # tensor_encoding's notes (one per traced encoder) stay off the terminal.
  quiet.import_tff()
  from fedsim.compression import check
  report = check.check_encoder(args.name, params)
  print(check.format_report(args.name, report))
  return 0 if report.passed else 1


def _seed_list(text: str) -> list[int]:
  """'0,1,2' -> [0, 1, 2] (argparse reports the error for anything else)."""
  parts = [part.strip() for part in text.split(",")]
  if not all(part.isascii() and part.isdigit() for part in parts):
    raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of"
                                     " seeds (integers >= 0), e.g. 0,1,2")
  seeds = [int(part) for part in parts]
  if max(seeds) > MAX_SEED:
    raise argparse.ArgumentTypeError(f"{max(seeds)} is beyond the largest seed, 2**31 - 1")
  if len(set(seeds)) != len(seeds):
    raise argparse.ArgumentTypeError(f"'{text}' repeats a seed")
  return seeds


def _accuracy(text: str) -> float:
  """An eval accuracy: a fraction in (0, 1]."""
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not 0 < value <= 1:
    raise argparse.ArgumentTypeError(f"'{text}' is not an accuracy in (0, 1], e.g. 0.9 for"
                                     " 90%")
  return value


def _png_path(text: str) -> str:
  if not text.lower().endswith(".png") or not os.path.basename(text)[:-4]:
    raise argparse.ArgumentTypeError(f"'{text}' is not a .png file's path, e.g. labels.png")
  if os.path.isdir(text):
    raise argparse.ArgumentTypeError(f"'{text}' is a directory, not a .png file")
  if (blocking := _file_in_the_way(os.path.dirname(text))) is not None:
    raise argparse.ArgumentTypeError(f"'{text}': {blocking} is a file, not a directory")
  return text


def _file_in_the_way(path: str) -> str | None:
  """The file that stands where directory `path`, or one of the directories
  above it, would be (None: each is a directory or can be made)."""
  here = os.path.abspath(path or ".")
  while not os.path.exists(here):
    here = os.path.dirname(here)
  if os.path.isdir(here):
    return None
  return os.path.relpath(here) if not os.path.isabs(path) else here


def _overrides(args) -> list[str]:
  """The --set overrides, then --seeds as `seeds=[...]`.

  Raises:
    UserError: both --seeds and --set seeds=... (neither would say it lost).
  """
  seeds = getattr(args, "seeds", None)
  if not seeds:
    return args.overrides
  for item in args.overrides:
    if item.partition("=")[0].strip() == "seeds":
      raise UserError(f"--seeds {','.join(map(str, seeds))} and --set {item}: give the seeds once")
  return [*args.overrides, f"seeds=[{','.join(map(str, seeds))}]"]


def _logdir(path: str) -> str:
  """`--logdir path`, unless a file stands where it or a directory above it
  would be (runs go under it).

  Raises:
    UserError: naming the flag and the path.
  """
  blocking = _file_in_the_way(path)
  if blocking is not None:
    where = "" if os.path.abspath(blocking) == os.path.abspath(path) else f" ({blocking} is a file)"
    raise UserError(f"--logdir {path}: not a directory{where}")
  return path


def _is_study_dir(path: pathlib.Path) -> bool:
  from fedsim.study.plan import is_study_dir  # NumPy: after the signal handlers
  return is_study_dir(path)


def _run(args) -> int:
  from fedsim.study.executors import choose  # NumPy: after the signal handlers
  _logdir(args.logdir)
  executor = choose(args.executor, args.jobs, args.ray_address, args.max_retries)
  target = _resume_target(args)
  if target is not None and not _is_study_dir(target) and (target / "config.yaml").is_file():
    return _run_one(args, target)
  from fedsim.study import runner
  started: list[pathlib.Path] = []

  def planned(study_dir: pathlib.Path) -> None:
    started.append(study_dir)
    _hint_forced_exit(_resume_command(study_dir, args.plugins))
  on_start = _announce if executor.name != "sequential" else (lambda run: None)
  if target is not None:  # the command to continue is known before anything is read
    planned(target)
  try:
    if args.config is None:
      study = runner.resume_study(target, args.overrides, executor=executor,
                                  progress=_progress(args), plugins=args.plugins,
                                  on_plan=planned, on_start=on_start)
    else:
      if target is not None:  # `--resume STUDY_DIR` with its CONFIG
        args.logdir = str(target.parent)
      study = runner.run_study(args.config, _overrides(args), logdir=args.logdir,
                               variant=args.variant, resume=args.resume is not None,
                               executor=executor, progress=_progress(args),
                               plugins=args.plugins, on_plan=planned,
                               on_start=on_start, study_name=target.name if target else None)
  except (KeyboardInterrupt, RunFailed, HostError, OSError) as e:
    if started:  # main() prints it after the error
      e.add_note("resume with: " + _resume_command(started[-1], args.plugins))
    raise
  return _study_report(study, args.plugins)


def _hint_forced_exit(command: str) -> None:
  from fedsim.runtime import signals  # pylint: disable=g-import-not-at-top
  signals.set_resume_hint(f"resume with: {command}")


def _progress(args) -> bool | None:
  return False if args.no_progress else None


def _announce(run) -> None:
  print(f"started {run.name()} ({run.run_dir})", flush=True)


def _resume_command(path: pathlib.Path, plugins: Sequence[str]) -> str:
  from fedsim import invocation
  return invocation.command("fedsim", ["run", "--resume", str(path),
                                       *(f"--plugin={plugin}" for plugin in plugins)])


def _study_report(study, plugins: Sequence[str]) -> int:
  """Prints each run's summary and the study's status table; 1 if a run failed."""
  from fedsim import invocation
  from fedsim.run_status import run_status, status_table
  from fedsim.reporting.summary import run_summary
  for outcome in study.outcomes:
    if outcome.result is not None:
      print(run_summary(outcome.result, outcome.run.label))
  for run in study.live:
    print(f"{run.name()}: left alone, another process is running {run.run_dir}")
  statuses = [run_status(r.run_dir) for r in study.planned]
  print(status_table(statuses, [r.name() for r in study.planned]))
  if len(statuses) > 1 and all(s.status == "completed" for s in statuses):
    _study_result(study.study_dir)
  print(f"logs: {study.study_dir}\n"
        f"view: {invocation.command('tensorboard', ['--logdir', str(study.study_dir)])}")
  if not study.failed:
    return 0
  retry = any(run_status(o.run.run_dir).resumable for o in study.failed)
  hint = f"; resume with: {_resume_command(study.study_dir, plugins)}" if retry else ""
  if len(study.planned) == 1:
    print(f"fedsim: run failed: {study.failed[0].error}{hint}", file=sys.stderr)
    return 1
  for outcome in study.failed:
    print(f"fedsim: run failed: {outcome.run.name()}: {outcome.error}", file=sys.stderr)
  print(f"fedsim: {len(study.failed)} of {len(study.planned)} runs failed; see"
        f" `fedsim status {study.study_dir}`{hint}", file=sys.stderr)
  return 1


def _study_result(study_dir: pathlib.Path) -> None:
  """Prints a complete study's table over seeds (if any variant has several)
  and writes it, with the accuracy-vs-bits figure, into the study directory."""
  from fedsim.reporting import compare
  by_seed = compare.compare_seeds(study_dir)
  if any(len(row["seeds"]) > 1 for row in by_seed):
    print(compare.format_seed_comparison(by_seed, compare.WIDTH))
    for path in compare.write_seed_table(study_dir, by_seed):
      print(f"table: {path}")
  print(f"plot: {compare.plot_accuracy_vs_bits(study_dir)}")


def _run_one(args, run_dir: pathlib.Path) -> int:
  """`fedsim run [CONFIG] --resume RUN_DIR`: that one run."""
  from fedsim import api, invocation
  from fedsim.reporting.summary import run_summary
  config, overrides = args.config, _overrides(args)
  if config is None:
    config, overrides = run_dir / "config.yaml", ["seeds=[]", *overrides]
  _hint_forced_exit(_resume_command(run_dir, args.plugins))
  try:
    results = api.run(config, overrides, logdir=args.logdir, progress=_progress(args),
                      resume=run_dir, variant=args.variant)
  except (KeyboardInterrupt, RunFailed, HostError, OSError) as e:
    e.add_note("resume with: " + _resume_command(run_dir, args.plugins))
    raise
  items = results.items() if isinstance(results, dict) else [(None, results)]
  for variant, result in items:
    print(run_summary(result, variant))
  print(f"logs: {run_dir}\nview: {invocation.command('tensorboard', ['--logdir', str(run_dir)])}")
  return 0


def _resume_target(args) -> pathlib.Path | None:
  """The directory `--resume` names: RUN_DIR or a study directory as given,
  without one the newest incomplete run's study under --logdir (None without
  --resume, or with `--resume` and CONFIG: the config's own study)."""
  from fedsim.run_status import find_runs
  from fedsim.reporting.rundir import read_status
  if args.resume is None:
    if args.config is None:
      raise UserError("run: CONFIG.yaml is required, unless --resume [DIR] continues runs")
    return None
  if args.config is None and (args.seeds or args.variant):
    raise UserError(f"{'--seeds' if args.seeds else '--variant'}: a run directory is one run;"
                    " give CONFIG.yaml to choose runs")
  if args.resume is not True:
    target = pathlib.Path(args.resume)
    if not target.is_dir():
      raise UserError(f"--resume {target}:"
                      f" {'not a directory' if target.exists() else 'no such directory'}")
    if not _is_study_dir(target) and not (target / "config.yaml").is_file():
      raise UserError(f"--resume {target}: not a fedsim run or study directory (no"
                      " config.yaml, no study.yaml)")
    return target
  if args.config is not None:
    return None
  statuses = {d: read_status(d)[0] for d in find_runs(args.logdir)}
  # 'running' is a live run (a dead writer on this host reads as 'killed').
  incomplete = [d for d, status in statuses.items() if status not in ("completed", "running")]
  if not incomplete:
    live = [str(d) for d, status in statuses.items() if status == "running"]
    raise UserError(f"--resume: no incomplete run under {args.logdir}"
                    + (f" that is not live ({', '.join(live)} still running)" if live else ""))
  run_dir = max(incomplete, key=lambda d: (d / "config.yaml").stat().st_mtime)
  return run_dir.parent if _is_study_dir(run_dir.parent) else run_dir


def _validate(args) -> int:
  from fedsim import api
  names = api.validate(args.config, _overrides(args), variant=args.variant)
  print(f"{args.config}: ok ({len(names)} run{'s' if len(names) != 1 else ''}:"
        f" {', '.join(names)})")
  for note in names.not_checked:
    print(note)
  return 0


def _list(args) -> int:
  from fedsim.catalog import format_catalog
  print(format_catalog(args.registry))
  return 0


def _compare(args) -> int:
  from fedsim.reporting import compare
  from fedsim.reporting.units import parse_bits
  budget = parse_bits(args.budget) if args.budget is not None else None
  width = None if args.wide else compare.WIDTH
  print(compare.format_comparison(compare.compare_runs(args.experiment_dir, args.target,
                                                       budget), width))
  by_seed = compare.compare_seeds(args.experiment_dir)
  if any(len(row["seeds"]) > 1 for row in by_seed):
    print()
    print(compare.format_seed_comparison(by_seed, width))
    for path in compare.write_seed_table(args.experiment_dir, by_seed):
      print(f"table: {path}")
  print(f"plot: {compare.plot_accuracy_vs_rounds(args.experiment_dir)}")
  print(f"plot: {compare.plot_accuracy_vs_bits(args.experiment_dir)}")
  if args.target is not None:
    from fedsim.reporting import board
    # TensorBoard's HParams 'to target' metrics then rank by the same target.
    where = board.refresh(args.experiment_dir, target=args.target)
    print(f"tensorboard: HParams 'to target' at eval accuracy {args.target}"
          + (f" ({where})" if where else ", once a run has completed"))
  return 0


def _status(args) -> int:
  from fedsim.run_status import find_runs, run_status, status_table
  path = pathlib.Path(args.path)
  if not _is_study_dir(path):
    statuses = [run_status(run_dir) for run_dir in find_runs(path)]
    for status in statuses:
      print(status.line())
  else:
    from fedsim.study.plan import read_plan
    planned = read_plan(path)
    statuses = [run_status(run.run_dir) for run in planned]
    print(status_table(statuses, [run.name() for run in planned]))
    listed = {run.run_dir for run in planned}
    others = [d for d in path.iterdir() if (d / "config.yaml").is_file() and d not in listed]
    if others:
      print(f"also here, from earlier studies: {len(others)} run"
            f" director{'ies' if len(others) > 1 else 'y'} (fedsim status {path / others[0].name}"
            " for one)")
    if any(s.resumable for s in statuses):
      print(f"resume with: {_resume_command(path, [])}")
  return 1 if any(s.status == "unreadable" or s.damaged for s in statuses) else 0


def _data(args) -> int:
  from fedsim.describe_data import describe
  print(describe(args.config, args.overrides, args.png, variant=args.variant,
                 logdir=_logdir(args.logdir) if args.png is None else None))
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  handlers = {"run": _run, "validate": _validate, "list": _list, "compare": _compare,
              "status": _status, "data": _data, "check": _check}
  try:
    if args.command == "run":  # before anything slow: from here on a signal ends it cleanly
      from fedsim.runtime import signals  # pylint: disable=g-import-not-at-top
      signals.install_exit_handlers()
    if args.command in ("run", "data") and (limit := host_limits.check_address_space()):
      raise UserError(limit)
    load_plugins(getattr(args, "plugins", []), os.getcwd(), key="--plugin")
    return handlers[args.command](args)
  except (MemoryError, ImportError, RuntimeError) as e:
    if not host_limits.is_out_of_memory(e):
      raise  # a bug: keeps its traceback
    print(f"fedsim: error: out of memory ({one_line(e)}){_hint(e)}", file=sys.stderr)
    return 1
  except UserError as e:
    print(f"fedsim: error: {e}", file=sys.stderr)
    return e.exit_code
  except RunFailed as e:
    print(f"fedsim: run failed: {e}{_hint(e)}", file=sys.stderr)
    return e.exit_code
  except (HostError, OSError) as e:  # The machine, not the input: a full disk, ...
    error = e if isinstance(e, HostError) else host_error(e)
    print(f"fedsim: error: {error}{_hint(e)}", file=sys.stderr)
    return error.exit_code
  except KeyboardInterrupt as e:
    print(f"fedsim: interrupted{_hint(e)}", file=sys.stderr)
    _exit_now_if_signalled(130)
    return 130
  except SystemExit as e:  # SIGTERM, as fedsim.runtime.signals raises it
    _exit_now_if_signalled(e.code if isinstance(e.code, int) else 1)
    raise


def _hint(error: BaseException) -> str:
  """'; resume with: ...' when `_run` noted how to continue the run, else ''."""
  notes = getattr(error, "__notes__", [])
  return f"; {notes[-1]}" if notes else ""


def _exit_now_if_signalled(code: int) -> None:
  from fedsim.runtime import signals  # pylint: disable=g-import-not-at-top
  signals.exit_now_if_signalled(code)


def _play_runs(plugin_args: Sequence[str]) -> None:
  """A player of `fedsim run --jobs N` (fedsim.study.player): each run directory
  it is sent played as `fedsim run --resume RUN_DIR --no-progress` is."""
  from fedsim.study import player  # pylint: disable=g-import-not-at-top
  player.serve(lambda run_dir: main(["run", "--resume", str(run_dir), "--no-progress",
                                     *plugin_args]))


def program() -> NoReturn:
  """`fedsim` as a program (the console script, `python -m fedsim.cli`): exits
  with `main()`'s code. A Ctrl-C that arrives once `main()` has returned finds
  the work done and reported: it ends nothing, so the exit goes on without a
  traceback and with `main()`'s code (`fedsim.runtime.signals.work_done`)."""
  if sys.argv[1:2] == ["--play-runs"]:
    _play_runs(sys.argv[2:])
  from fedsim.runtime import signals  # pylint: disable=g-import-not-at-top
  code = None
  try:
    try:
      code = main()
    except KeyboardInterrupt:  # a Ctrl-C handled as main() returned
      code = 130
    finally:
      if code is not None:  # else a SystemExit main() let through: Python's own exit
        signals.work_done(code)
  except KeyboardInterrupt:  # handled before work_done() took effect; it raises only once
    if code is not None:
      signals.work_done(code)
  sys.exit(code)


if __name__ == "__main__":
  program()
