"""The `fedsim` command line.

Exit codes: 0 success, 1 a run that failed (divergence, dead runtime) or the
machine refused (a full disk), 2 bad input (one line on stderr naming the
culprit), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import sys
from typing import Sequence

from fedsim import host_limits
from fedsim.errors import HostError, RunFailed, UserError, host_error, one_line
from fedsim.plugins import load_plugins


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
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

  run = sub.add_parser("run", help="run an experiment (all its variants)",
                       description="Run an experiment: every variant in turn, each into"
                                   " <logdir>/<name>/<run>/ with metrics.csv, TensorBoard"
                                   " events and config.yaml.")
  add_config_args(run, "experiment config file; left out with --resume, the run's own"
                       " config.yaml (RUN_DIR's, or the newest incomplete run's under"
                       " --logdir)", optional=True)
  add_seeds_arg(run)
  run.add_argument("--logdir", default="runs", help="root directory of runs (default: runs)")
  run.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is off anyway when stdout is not a terminal)")
  start = run.add_mutually_exclusive_group()
  start.add_argument("--resume", nargs="?", const=True, default=None, metavar="RUN_DIR",
                     help="resume RUN_DIR from its last checkpoint, or without RUN_DIR the"
                          " newest incomplete run of each variant (having none is an"
                          " error); without this flag every run starts a new directory")
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
  listing.add_argument("registry", nargs="?", metavar="REGISTRY",
                       help="only this registry, e.g. encoder or model")
  add_plugin_arg(listing)

  compare = sub.add_parser("compare", help="compare the runs of an experiment",
                           description="Print a table of an experiment's runs (final eval"
                                       " accuracy, total bits each way, ratio vs. an"
                                       " uncompressed run; per variant over seeds, the"
                                       " mean and 95% interval) and write"
                                       " accuracy_vs_bits.png and accuracy_vs_rounds.png"
                                       " into the experiment directory.")
  compare.add_argument("--target", type=float, default=None, metavar="ACCURACY",
                       help="also show where each run first reached this eval accuracy:"
                            " its round, cumulative bits both ways and simulated hours")
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
                          description="Print one line per run directory: its status"
                                      " (running, completed, failed, interrupted) and why,"
                                      " the last round logged, and the checkpoint a"
                                      " --resume would continue from.")
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
  describe.add_argument("--png", default=None,
                        help="where to write the plot (default: the experiment's log"
                             " directory, <logdir>/<name>/label_distribution.png)")
  describe.add_argument("--logdir", default="runs",
                        help="root directory of runs (default: runs)")
  _add_check_parser(sub, add_plugin_arg)
  return parser


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
  encoder.add_argument("params", nargs="*", metavar="KEY=VALUE",
                       help="encoder parameters as YAML values, e.g. bits=4")
  add_plugin_arg(encoder)


def _check(args) -> int:
  from fedsim.compression import check
  from fedsim.experiment.config.merge import parse_set
  params = {}
  for item in args.params:
    if "." in item.partition("=")[0]:
      raise UserError(f"{item}: expected KEY=VALUE, a parameter of encoder '{args.name}'")
    params.update(parse_set(item))
  reports = check.check_encoder(args.name, params)
  print(check.format_report(args.name, reports))
  return 0 if all(r.sum_decodes for r in reports) else 1


def _seed_list(text: str) -> list[int]:
  """'0,1,2' -> [0, 1, 2] (argparse reports the error for anything else)."""
  try:
    seeds = [int(part) for part in text.split(",")]
  except ValueError:
    raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of"
                                     " integers, e.g. 0,1,2") from None
  return seeds


def _overrides(args) -> list[str]:
  """The --set overrides, then --seeds as `seeds=[...]`."""
  seeds = getattr(args, "seeds", None)
  return args.overrides + ([f"seeds=[{','.join(map(str, seeds))}]"] if seeds else [])


def _run(args) -> int:
  from fedsim import api
  from fedsim.reporting.summary import run_summary
  config, resume, overrides = args.config, args.resume, _overrides(args)
  if config is None:
    config, resume = _run_to_resume(args)
    overrides = ["seeds=[]", *overrides]  # the run's own `seed`; `seeds` made its siblings
  started = []
  try:
    results = api.run(config, overrides, logdir=args.logdir,
                      progress=False if args.no_progress else None,
                      on_run_dir=started.append, resume=resume, fresh=args.fresh,
                      variant=args.variant)
  except (KeyboardInterrupt, RunFailed, HostError, OSError) as e:
    if started:  # main() prints it after the error
      e.add_note("resume with: " + shlex.join(
          ["fedsim", "run", "--resume", str(started[-1]),
           *(f"--plugin={plugin}" for plugin in args.plugins)]))
    raise
  items = results.items() if isinstance(results, dict) else [(None, results)]
  experiment_dir = None
  for variant, result in items:
    print(run_summary(result, variant))
    experiment_dir = result.run_dir.parent
  print(f"logs: {experiment_dir}\nview: tensorboard --logdir {experiment_dir}")
  return 0


def _run_to_resume(args) -> tuple[pathlib.Path, pathlib.Path]:
  """(config.yaml, run directory) for `fedsim run --resume [RUN_DIR]` without
  CONFIG: RUN_DIR, or the newest incomplete run under --logdir."""
  from fedsim.experiment.status import find_runs
  from fedsim.reporting.rundir import read_status
  if args.resume is None:
    raise UserError("run: CONFIG.yaml is required, unless --resume [RUN_DIR] continues a run")
  if args.seeds or args.variant:
    raise UserError(f"{'--seeds' if args.seeds else '--variant'}: a run directory is one run;"
                    " give CONFIG.yaml to choose runs")
  if args.resume is True:
    statuses = {d: read_status(d)[0] for d in find_runs(args.logdir)}
    # 'running' is a live run (a dead writer on this host reads as 'killed').
    incomplete = [d for d, status in statuses.items() if status not in ("completed", "running")]
    if not incomplete:
      live = [str(d) for d, status in statuses.items() if status == "running"]
      raise UserError(f"--resume: no incomplete run under {args.logdir}"
                      + (f" that is not live ({', '.join(live)} still running)" if live else ""))
    run_dir = max(incomplete, key=lambda d: (d / "config.yaml").stat().st_mtime)
  else:
    run_dir = pathlib.Path(args.resume)
  if not (run_dir / "config.yaml").is_file():
    raise UserError(f"--resume {run_dir}: not a fedsim run directory (no config.yaml)")
  return run_dir / "config.yaml", run_dir


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
  print(f"plot: {compare.plot_accuracy_vs_rounds(args.experiment_dir)}")
  print(f"plot: {compare.plot_accuracy_vs_bits(args.experiment_dir)}")
  return 0


def _status(args) -> int:
  from fedsim.experiment.status import find_runs, run_status
  statuses = [run_status(run_dir) for run_dir in find_runs(args.path)]
  for status in statuses:
    print(status.line())
  return 1 if any(s.status == "unreadable" or s.damaged for s in statuses) else 0


def _data(args) -> int:
  from fedsim.experiment.describe import describe
  print(describe(args.config, args.overrides, args.png, variant=args.variant,
                 logdir=args.logdir))
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


if __name__ == "__main__":
  sys.exit(main())
