"""The experiment config: the typed form of an experiment YAML file."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

from fedsim.aggregation import (check_chain, parse_aggregation, parse_broadcast)
from fedsim.algorithms import ALGORITHMS
from fedsim.compression import check_upload_feedback, parse_compression
from fedsim.config.typed import Component, bounded, component, custom
from fedsim.control.engine import find_controlled
from fedsim.data import DATASETS
from fedsim.errors import UserError
from fedsim.seeds import MAX_SEED
from fedsim.system.clock import SystemConfig
from fedsim.models import MODELS
from fedsim.runtime.runtime_registry import RUNTIMES


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  every: int = bounded(1, min=1)         # evaluate the global model every N rounds (and after the last)
  batch_size: int = bounded(256, min=1)  # evaluation batch size (does not change results)
  # Per-client evaluation (eval_clients/*): the global model on each client's
  # own test split, or on a seeded `holdout_fraction` of each client's
  # examples (then not trained on) for datasets without one.
  federated: bool = False
  federated_clients: Literal["sampled", "all"] = "sampled"
  holdout_fraction: float = bounded(0.2, gt=0, max=0.9)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  every: int = bounded(10, min=1)  # checkpoint every N rounds (and always after the last)
  keep: int = bounded(3, min=1)    # newest checkpoints kept in <run_dir>/checkpoints


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  name: str
  rounds: int = bounded(min=1)
  clients_per_round: int = bounded(min=1)
  data: Component = component(DATASETS)
  model: Component = component(MODELS)
  algorithm: Component = component(ALGORITHMS, {"name": "fedavg"})
  seed: int = bounded(0, min=0, max=MAX_SEED)
  # Run every variant once per seed (run directories '<variant>-seed<N>');
  # empty: one run with `seed`.
  seeds: list[int] = dataclasses.field(default_factory=list)
  # Over-selection: sample clients_per_round + backup_clients, aggregate the
  # first clients_per_round to finish (see fedsim/system/clock.py).
  backup_clients: int = bounded(0, min=0)
  # How a round's clients are drawn (fedsim/data/sampling.py): `fixed`, exactly
  # clients_per_round (+ backup_clients) of them; `poisson`, each client with
  # probability sampling_rate (default clients_per_round / clients), so
  # clients_per_round is the expected count. Each has its own DP accounting.
  sampling: Literal["fixed", "poisson"] = "fixed"
  sampling_rate: float | None = bounded(None, gt=0, max=1, used_with=("sampling", "poisson"))
  system: SystemConfig = dataclasses.field(default_factory=SystemConfig)
  eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
  # Which runtime runs the rounds, with its own keys (fedsim/runtime/runtime_registry.py;
  # `fedsim list runtime`).
  runtime: Component = component(RUNTIMES, {"name": "auto"})
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
  # Ordered stages per direction (see fedsim/aggregation); `compression` is
  # the shorthand for an `encode` stage at the end of each.
  aggregation: tuple = custom(parse_aggregation, ())
  broadcast: tuple = custom(parse_broadcast, ())
  compression: Any = custom(parse_compression, None)
  description: str = ""
  # Modules or .py files imported before validation, for the entries they
  # register (see fedsim/plugins.py; the loader imports them).
  plugins: list[str] = dataclasses.field(default_factory=list)
  # Named overrides of this config, run one after another (see `expand_variants`).
  variants: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

  def check(self, key: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.name):
      raise UserError(f"name: '{self.name}' must be letters, digits, '_', '-' or '.'"
                      " (it names the log directory)")
    num_clients = getattr(self.data.params, "num_clients", None)
    if num_clients is not None and self.clients_per_round > num_clients:
      raise UserError(f"clients_per_round: {self.clients_per_round} is larger than"
                      f" data.num_clients ({num_clients})")
    if num_clients is not None and self.clients_per_round + self.backup_clients > num_clients:
      raise UserError(f"backup_clients: clients_per_round + backup_clients ="
                      f" {self.clients_per_round + self.backup_clients} is larger than"
                      f" data.num_clients ({num_clients})")
    self._check_sampling()
    if self.system.min_clients > self.clients_per_round:
      raise UserError(f"system.min_clients: {self.system.min_clients} is larger than"
                      f" clients_per_round ({self.clients_per_round})")
    check_experiment = getattr(self.algorithm.params, "check_experiment", None)
    if check_experiment is not None:  # keys an algorithm cannot honour (e.g. asynchronous ones)
      check_experiment(self)
    self._check_aggregation()
    for seed in self.seeds:
      if not 0 <= seed <= MAX_SEED:
        raise UserError(f"seeds: {seed} is not in [0, 2**31 - 1]")
    if len(set(self.seeds)) != len(self.seeds):
      raise UserError(f"seeds: {self.seeds} repeats a seed")
    if self.variants:  # imported only then: the reporting package is ~50 ms of start-up
      from fedsim.reporting.rundir import EXPERIMENT_ENTRIES
    for variant in self.variants:
      if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", variant):
        raise UserError(f"variants.{variant}: a variant's name starts with a letter or digit"
                        " and holds only letters, digits, '_', '-' and '.'")
      if variant in EXPERIMENT_ENTRIES:  # its run directory would be fedsim's own file
        raise UserError(f"variants.{variant}: '{variant}' is taken by what fedsim writes"
                        " beside the runs (the study's plan, `fedsim compare`'s outputs:"
                        f" {', '.join(sorted(EXPERIMENT_ENTRIES))}); rename the variant")

  def _check_sampling(self) -> None:
    if self.sampling != "poisson":
      return
    if self.backup_clients:
      # Over-selection picks the fastest of the sample: the round would no
      # longer be each client with probability q, which its accounting assumes.
      raise UserError(f"backup_clients: {self.backup_clients} backup clients with sampling:"
                      " poisson; over-selection needs a fixed-size sample (set"
                      " sampling: fixed, or backup_clients: 0)")

  def poisson_rate(self, population: int) -> float | None:
    """q, each client's chance to be in a round, with `sampling: poisson`; else None."""
    if self.sampling != "poisson":
      return None
    return self.sampling_rate or min(1.0, self.clients_per_round / population)

  def aggregation_chain(self) -> tuple:
    """The aggregation stages, with `compression.aggregation` as a final `encode`."""
    spec = getattr(self.compression, "aggregation", None)
    return self.aggregation + ((Component("encode", spec, "compression.aggregation"),)
                               if spec is not None else ())

  def broadcast_chain(self) -> tuple:
    """The broadcast stages, or `compression.broadcast` as one `encode` stage."""
    spec = getattr(self.compression, "broadcast", None)
    return self.broadcast or ((Component("encode", spec, "compression.broadcast"),)
                              if spec is not None else ())

  def _check_aggregation(self) -> None:
    from fedsim.aggregation import SUM, role_of
    if getattr(self.compression, "aggregation", None) is not None and any(
        role_of(s) == SUM for s in self.aggregation):
      raise UserError("compression.aggregation: the aggregation chain already ends in"
                      f" '{self.aggregation[-1].name}'; put {{name: encode, ...}} there instead")
    if getattr(self.compression, "broadcast", None) is not None and self.broadcast:
      raise UserError("compression.broadcast: a broadcast chain is set too; keep one of them")
    kind = getattr(self.algorithm.params, "aggregation_kind", None)
    chain = self.aggregation_chain()
    check_chain(chain, kind() if kind else None, self.algorithm.name,
                self.clients_per_round, sampling=self.sampling)
    traits = ALGORITHMS.get(self.algorithm.name).traits   # what a build would refuse
    check_upload_feedback(chain, traits["model_delta_upload"], traits["clients_keep_state"])
    # One controlled parameter per run: the run's own check, here before it starts.
    find_controlled({"aggregation": chain, "broadcast": self.broadcast_chain()})
