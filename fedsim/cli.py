"""The `fedsim` command line.

Exit codes: 0 success, 1 a run that failed (divergence, dead runtime),
2 bad input (one line on stderr naming the culprit), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from fedsim.errors import RunFailed, UserError


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="fedsim",
      description="Federated learning simulation on TensorFlow Federated, measuring"
                  " accuracy and the bits that cross the wire.")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")
  sub.required = True

  def add_config_args(p):
    p.add_argument("config", metavar="CONFIG.yaml", help="experiment config file")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="override a config key with a typed YAML value, e.g."
                        " --set rounds=3 --set data.alpha=0.1 (repeatable)")

  run = sub.add_parser("run", help="run an experiment (all its variants)",
                       description="Run an experiment: every variant in turn, each into"
                                   " <logdir>/<name>/<run>/ with metrics.csv, TensorBoard"
                                   " events and config.yaml.")
  add_config_args(run)
  run.add_argument("--logdir", default="runs", help="root directory of runs (default: runs)")
  run.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is off anyway when stdout is not a terminal)")

  validate = sub.add_parser("validate", help="check a config without running it",
                            description="Validate a config and its variants; exit 2 with"
                                        " the offending key if anything is wrong.")
  add_config_args(validate)
  return parser


def _summary(result, variant: str | None) -> str:
  from fedsim.reporting import format_bits
  final = result.final
  sizes = result.size_info
  ref_b, ref_a = result.uncompressed_bits_per_client
  wire = sizes.per_client
  label = f"[{variant}] " if variant else ""
  acc = final.get("eval/accuracy")
  lines = [
      f"{label}run dir: {result.run_dir}",
      f"{label}rounds: {len(result.metrics)}"
      + (f", final eval/accuracy {acc:.4f}" if acc is not None else ""),
      f"{label}communicated: broadcast {format_bits(sizes.broadcast_bits)}"
      f" ({ref_b / wire.broadcast:.2f}x less than uncompressed),"
      f" aggregate {format_bits(sizes.aggregate_bits)}"
      f" ({ref_a / wire.aggregate:.2f}x less than uncompressed)",
  ]
  return "\n".join(lines)


def _run(args) -> int:
  from fedsim import api
  from fedsim.runtime import worker
  worker.install_sigterm_handler()
  results = api.run(args.config, args.overrides, logdir=args.logdir,
                    progress=False if args.no_progress else None)
  items = results.items() if isinstance(results, dict) else [(None, results)]
  experiment_dir = None
  for variant, result in items:
    print(_summary(result, variant))
    experiment_dir = result.run_dir.parent
  print(f"logs: {experiment_dir}\nview: tensorboard --logdir {experiment_dir}")
  return 0


def _validate(args) -> int:
  from fedsim import api
  names = api.validate(args.config, args.overrides)
  print(f"{args.config}: ok ({len(names)} run{'s' if len(names) != 1 else ''}:"
        f" {', '.join(names)})")
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  handlers = {"run": _run, "validate": _validate}
  try:
    return handlers[args.command](args)
  except UserError as e:
    print(f"fedsim: error: {e}", file=sys.stderr)
    return e.exit_code
  except RunFailed as e:
    print(f"fedsim: run failed: {e}", file=sys.stderr)
    return e.exit_code
  except KeyboardInterrupt:
    print("fedsim: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
