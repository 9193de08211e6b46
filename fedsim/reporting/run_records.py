"""The runs of an experiment as they are on disk: each run directory's
`config.yaml`, `metrics.csv` and `status`, read back without TensorFlow and
without the runs' process (runs still going or cut short included).
`fedsim compare`'s table and figures are made from these.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Mapping, Sequence

import yaml

from fedsim.config.typed import Component
from fedsim.errors import UserError
from fedsim.metric_names import EVAL_ACCURACY, ROUND, SIMULATED_SECONDS, bits_sent
from fedsim.reporting.rundir import read_status
from fedsim.reporting.sinks import read_metrics_csv

ACCURACY = EVAL_ACCURACY  # compare's name for it
# Encoders that send every tensor as it is: a run using only these is a reference.
_LOSSLESS_ENCODERS = frozenset({"identity"})


@dataclasses.dataclass(frozen=True)
class Run:
  """One run directory as written by fedsim: name, status, config and metrics."""

  name: str
  path: pathlib.Path
  status: str                      # 'completed', 'failed', 'interrupted', 'running' or 'unknown'
  message: str                     # why a run failed, from its status file
  config: Mapping[str, Any]        # the resolved config.yaml
  metrics: Sequence[Mapping[str, float]]  # one dict per round, as in metrics.csv

  @property
  def uncompressed(self) -> bool:
    """True if neither direction encodes anything (no or only lossless encoders)."""
    compression = self.config.get("compression") or {}
    encoders = [(spec or {}).get("encoder") for spec in compression.values()]
    stages = [(direction, stage) for direction in ("aggregation", "broadcast")
              for stage in self.config.get(direction) or ()]
    encoders += [stage.get("encoder") for _, stage in stages if stage.get("name") == "encode"]
    return all(encoder in _LOSSLESS_ENCODERS for encoder in encoders) and not any(
        _compresses(direction, stage.get("name")) for direction, stage in stages
        if stage.get("name") != "encode")

  def total_bits(self, direction: str, entropy: bool = False) -> int | None:
    """Bits sent in `direction` ('broadcast'/'aggregate') over the recorded rounds.

    `entropy`: what an entropy coder would have sent instead, from the
    `<direction>_entropy_bits` columns; None if the run did not record them.
    """
    if not self.metrics:
      return None
    name = f"{direction}_entropy_bits" if entropy else f"{direction}_bits"
    cumulative = self.metrics[-1].get(f"cumulative_{name}")
    if cumulative is not None:
      return int(cumulative)
    if entropy and not any(name in row for row in self.metrics):
      return None
    return int(sum(row.get(name, 0) for row in self.metrics))

  def mean_bits_per_client(self, direction: str) -> float | None:
    """Mean over rounds of what a client was measured to send or receive
    (`<direction>_bits_per_client_mean`, else the static `<direction>_bits_per_client`
    of a run logged before it); None if never recorded."""
    fixed, measured = f"{direction}_bits_per_client", f"{direction}_bits_per_client_mean"
    values = [row.get(measured, row[fixed]) for row in self.metrics if fixed in row]
    return sum(values) / len(values) if values else None

  def accuracy_vs_bits(self) -> tuple[list[float], list[float]]:
    """(cumulative broadcast + aggregate bits, eval accuracy) at each eval round."""
    bits, accuracy = [], []
    for row in self.metrics:
      if ACCURACY in row:
        bits.append(bits_sent(row))
        accuracy.append(row[ACCURACY])
    return bits, accuracy

  def to_target(self, target: float) -> dict[str, float] | None:
    """Where the run first evaluated at `target` accuracy or above: its round,
    cumulative bits (both directions) and simulated seconds; None if never."""
    for row in self.metrics:
      if row.get(ACCURACY, -1.0) >= target:
        return {"round": row.get(ROUND), "bits": bits_sent(row),
                "seconds": row.get(SIMULATED_SECONDS)}
    return None

  def within_budget(self, budget: float) -> dict[str, float] | None:
    """The best eval accuracy among evaluations made with at most `budget`
    cumulative bits (broadcast + aggregate) sent: its 'accuracy', 'round' and
    'bits' (the earliest round on ties); None if no evaluation fits. A run
    that ended below the budget counts all its evaluations."""
    best = None
    for bits, accuracy, round_num in zip(*self.accuracy_vs_bits(), self._eval_rounds()):
      if bits <= budget and (best is None or accuracy > best["accuracy"]):
        best = {"accuracy": accuracy, "round": round_num, "bits": bits}
    return best

  def _eval_rounds(self) -> list[float | None]:
    return [row.get("round") for row in self.metrics if ACCURACY in row]


def _compresses(direction: str, name: Any) -> bool:
  """True if the registered stage `name` of `direction` sends something
  other than the update itself (e.g. `majority_vote`'s sign bits)."""
  from fedsim.aggregation import AGGREGATION_STAGES, BROADCAST_STAGES, is_compressing
  registry = AGGREGATION_STAGES if direction == "aggregation" else BROADCAST_STAGES
  try:
    return is_compressing(registry, Component(name, None))
  except UserError:   # a plugin's stage, not imported here: assume it does not
    return False


# libyaml's parser when PyYAML has it (its wheels do): the same documents, a
# run's config read in 0.7 ms instead of 6.4 ms. `fedsim.reporting.board`
# re-reads every run each time a run of the experiment completes.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_run_config(path: pathlib.Path) -> Mapping[str, Any]:
  """A run's config.yaml as written (a mapping).

  Raises:
    UserError: naming the file when it cannot be read or is not a mapping.
  """
  try:
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=_SAFE_LOADER)  # noqa: S506 (safe)
  except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
    raise UserError(f"{path}: cannot read run config ({e.__class__.__name__})") from None
  if not isinstance(data, dict):
    raise UserError(f"{path}: not a fedsim run config (expected a mapping)")
  return data


def _is_run_dir(path: pathlib.Path) -> bool:
  return (path / "metrics.csv").is_file() and (path / "config.yaml").is_file()


def load_runs(experiment_dir: str | os.PathLike) -> list[Run]:
  """Reads every run directory directly under `experiment_dir`.

  A run directory holds `metrics.csv` and `config.yaml`; other entries are
  skipped. Runs are ordered by when they started (config.yaml's mtime), then
  by name, so variants appear in the order `fedsim run` ran them.

  Returns:
    The runs, possibly failed or still running.

  Raises:
    UserError: naming the path, if it is not a directory, holds no run, is
      itself a run directory, or a run's files cannot be read.
  """
  root = pathlib.Path(experiment_dir)
  if not root.exists():
    raise UserError(f"{root}: no such directory")
  if not root.is_dir():
    raise UserError(f"{root}: not a directory (expected an experiment directory such as"
                    " runs/<name>)")
  if _is_run_dir(root):
    raise UserError(f"{root}: is a single run; pass its experiment directory {root.parent}")
  found = sorted((p for p in root.iterdir()
                  if not p.name.startswith(".") and p.is_dir() and _is_run_dir(p)),
                 key=lambda p: ((p / "config.yaml").stat().st_mtime_ns, p.name))
  if not found:
    raise UserError(f"{root}: no run directories (with metrics.csv and config.yaml) in it")
  runs = []
  for path in found:
    status, message = read_status(path)
    runs.append(Run(name=path.name, path=path, status=status or "unknown", message=message,
                    config=read_run_config(path / "config.yaml"),
                    metrics=read_metrics_csv(path / "metrics.csv",
                                             complete=status == "completed")))
  return runs
