"""What happens to client updates between the clients and the server, as a chain of stages.

Config (each list is ordered outermost first; both are optional):

  aggregation:                                   # clients -> server
    - {name: zeroing, max_norm: 100.0}           # drop updates with a huge norm
    - {name: clip, norm: 1.0}                    # L2 clipping (fixed, or adaptive)
    - {name: dp_gaussian, noise_multiplier: 1.0} # clip + Gaussian noise + mean
    - {name: encode, encoder: uniform, bits: 8}  # what each client sends
  broadcast:                                     # server -> clients
    - {name: encode, encoder: uniform, bits: 8}

Each stage is a registered entry that builds a `tff.aggregators` factory
around the stages after it (`wrap`), takes the place of the algorithm's mean
(`private`, `complete`), marks where that mean goes (`mean`) or ends the chain
with the sum that crosses the wire (`sum`). Unless the chain says otherwise,
the algorithm's mean (weighted by examples, unweighted, or a plain sum: the
algorithm decides) sits right above the first `sum` stage, so stages listed
before `encode` see each client's raw update. See `chain.py` for the
assembly rules and `builtin_stages.py` for the stages fedsim ships.

This module parses and checks chains without TensorFlow, so `fedsim validate`
finds an impossible composition (e.g. example-weighted differential privacy)
in a fraction of a second.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from fedsim.config.typed import Component, parse
from fedsim.errors import UserError
from fedsim.registry import NoParams, Registry

# What a stage does in the chain (see the module docstring).
WRAP, MEAN, SUM, PRIVATE, COMPLETE = "wrap", "mean", "sum", "private", "complete"
ROLES = (WRAP, MEAN, SUM, PRIVATE, COMPLETE)

# What a stage states besides its builder and parameters (`register_aggregation_stage`).
_STAGE_TRAITS = {
    "role": WRAP,             # or a function of the params giving one
    "inner_key": None,        # where the built factory nests its inner one's measurements
    "own_key": None,          # the key of the stage's own measurements, if only one
    "parser": None,           # (data, key) -> params, for a layout of its own
    "compresses": False,      # changes what crosses the wire (left out of the uncompressed reference)
    "check_context": None,    # (params, StageContext, key) -> None or UserError
    "privacy_ledger": None,   # (params, PrivacyScope) -> the privacy it spends
}
AGGREGATION_STAGES = Registry("aggregation stage", traits=_STAGE_TRAITS)
BROADCAST_STAGES = Registry("broadcast stage",
                            traits={"parser": None, "compresses": False})

# How the algorithm combines client updates: by `FederatedAlgorithm` kind.
WEIGHTED_MEAN, UNWEIGHTED_MEAN, PLAIN_SUM = "weighted_mean", "mean", "sum"


@dataclasses.dataclass(frozen=True)
class StageContext:
  """What a stage builder may need beyond its own parameters."""

  kind: str                 # WEIGHTED_MEAN, UNWEIGHTED_MEAN or PLAIN_SUM
  clients_per_round: int    # the expected number of aggregated clients
  seed: int                 # the run seed (noise is derived from it)
  index: int                # the stage's position in its chain
  sampling: str = "fixed"   # how rounds draw clients: "fixed" or "poisson" (data/sampling.py)


def register_aggregation_stage(name: str, params: type = NoParams, *, role: str = WRAP,
                               inner_key: str | None = None, own_key: str | None = None,
                               parser: Callable[[Any, str], Any] | None = None,
                               compresses: bool = False,
                               check_context: Callable | None = None,
                               privacy_ledger: Callable | None = None,
                               replace: bool = False) -> Callable:
  """Decorator that adds an aggregation stage, usable as `{name: NAME, ...}` in config.

  The decorated builder is called as:
    role 'wrap':     build(params, inner_factory, context) -> factory wrapping inner
    role 'private':  build(params, inner_sum_factory, context) -> unweighted mean factory
    role 'sum':      build(params, context) -> UnweightedAggregationFactory (a sum)
    role 'complete': build(params, context) -> the whole aggregation from here down
  where factories are `tff.aggregators` factories and `context` is a
  `StageContext`. `inner_key` names the key under which the built factory's
  measurements nest its inner factory's (TFF's zeroing uses 'zeroing'); the
  stage's own measurements are the other keys, or only those under `own_key`
  when it names one (TFF's DP factory: 'dp_query_metrics'). `parser(data, key)` replaces
  the typed parsing of `params` for stages with a layout of their own. `role`,
  `inner_key` and `own_key` may be functions of the params. `compresses`: the stage
  changes what crosses the wire (an uncompressed reference run leaves it out);
  `check_context(params, context, key)` raises UserError for rules that depend on
  the experiment; `privacy_ledger(params, scope)` returns what the stage spends
  (see `privacy_ledgers`).

  Raises:
    ValueError: an unknown role, or a taken name without `replace`.
  """
  if not callable(role) and role not in ROLES:
    raise ValueError(f"role must be one of {', '.join(ROLES)} (or a function of the params"
                     f" giving one), got {role!r}")

  return AGGREGATION_STAGES.register(name, params=params, replace=replace, traits=dict(
      role=role, inner_key=inner_key, own_key=own_key, parser=parser, compresses=compresses,
      check_context=check_context, privacy_ledger=privacy_ledger))


def register_broadcast_stage(name: str, params: type = NoParams, *,
                             parser: Callable[[Any, str], Any] | None = None,
                             compresses: bool = False, replace: bool = False) -> Callable:
  """Decorator that adds a broadcast stage: `build(params, weights_type, context)`
  returns a `tff.learning.templates.DistributionProcess` for the model weights."""
  return BROADCAST_STAGES.register(name, params=params, replace=replace,
                                   traits=dict(parser=parser, compresses=compresses))


def _trait(stage: Component, name: str) -> Any:
  """An aggregation stage's trait, evaluated on its params when it is a function of them."""
  value = AGGREGATION_STAGES.get(stage.name).traits[name]
  return value(stage.params) if callable(value) else value


def role_of(stage: Component) -> str:
  """The role of a parsed aggregation stage (a builder may decide it from its params)."""
  return _trait(stage, "role")


def measurement_keys(stage: Component) -> tuple[str | None, str | None]:
  """(inner_key, own_key) of a stage's TFF measurements (see `register_aggregation_stage`)."""
  return _trait(stage, "inner_key"), _trait(stage, "own_key")


def parse_chain(registry: Registry, data: Any, key: str) -> tuple[Component, ...]:
  """Parses a list of `{name: STAGE, **params}` (or bare names) into Components.

  Raises:
    UserError: naming `key[i]` and the unknown stage or key.
  """
  if data is None:
    return ()
  if not isinstance(data, Sequence) or isinstance(data, (str, bytes)):
    raise UserError(f"{key}: expected a list of stages, e.g. [{{name: clip, norm: 1.0}}],"
                    f" got {data!r:.40}")
  stages = []
  for i, item in enumerate(data):
    where = f"{key}[{i}]"
    if isinstance(item, str):
      item = {"name": item}
    if not isinstance(item, Mapping) or "name" not in item:
      raise UserError(f"{where}: expected a mapping with a 'name' key (one of:"
                      f" {', '.join(registry.names())}), got {item!r:.40}")
    entry = registry.get(item["name"], f"{where}.name")
    rest = {k: v for k, v in item.items() if k != "name"}
    custom = entry.traits["parser"]
    params = custom(rest, where) if custom else parse(entry.params, rest, where,
                                                      reserved=("name",))
    stages.append(Component(entry.name, params, where))
  return tuple(stages)


def parse_aggregation(data: Any, key: str = "aggregation") -> tuple[Component, ...]:
  return parse_chain(AGGREGATION_STAGES, data, key)


def parse_broadcast(data: Any, key: str = "broadcast") -> tuple[Component, ...]:
  stages = parse_chain(BROADCAST_STAGES, data, key)
  if len(stages) > 1:
    raise UserError(f"{key}: at most one broadcast stage (the server sends one encoding"
                    f" of the model), got {len(stages)}")
  return stages


def check_chain(stages: Sequence[Component], kind: str | None, algorithm: str,
                clients_per_round: int, key: str = "aggregation", *,
                sampling: str = "fixed") -> None:
  """Raises UserError (one line naming the stage) if TFF cannot build this chain.

  `kind` is how `algorithm` combines updates, or None when it does not say
  (a plugin algorithm): then only the order of stages is checked. A stage
  stage may be registered with `check_context(params, context, key)` for rules that
  depend on the experiment (e.g. the clients per round).
  """
  from fedsim.aggregation.builtin_stages import absorb_clip
  from fedsim.compression import upload_feedback
  upload_feedback(stages)   # error feedback needs its encode stage alone in the chain
  stages = absorb_clip(stages)
  roles = [role_of(s) for s in stages]
  for i, (stage, role) in enumerate(zip(stages, roles)):
    written = stage.key or f"{key}[{i}]"
    where = f"{written} {stage.name}"
    check = AGGREGATION_STAGES.get(stage.name).traits["check_context"]
    if check is not None:
      check(stage.params, StageContext(kind or "", clients_per_round, 0, i, sampling), written)
    last = i == len(stages) - 1
    if role == SUM and not last:
      raise UserError(f"{where}: this stage sends the values and must come last;"
                      f" it is followed by '{stages[i + 1].name}'")
    if role == COMPLETE and not last:
      raise UserError(f"{where}: builds the whole aggregation below it and must come last")
    if role in (MEAN, PRIVATE, COMPLETE):
      earlier = [s.name for s, r in zip(stages[:i], roles[:i]) if r in (MEAN, PRIVATE, COMPLETE)]
      if earlier:
        raise UserError(f"{where}: the chain already averages at '{earlier[0]}'")
      later = [s.name for s, r in zip(stages[i + 1:], roles[i + 1:]) if r in (WRAP, PRIVATE)]
      if role == PRIVATE and later:
        raise UserError(f"{where}: '{later[0]}' after it would act on clipped, noised"
                        " values; put it before the private stage")
    if role in (MEAN, PRIVATE) and kind == PLAIN_SUM:
      raise UserError(f"{where}: algorithm '{algorithm}' sums client updates, it does not"
                      " average them")
    if role == PRIVATE and kind == WEIGHTED_MEAN:
      raise UserError(f"{where}: differentially private aggregation is unweighted, but"
                      f" algorithm '{algorithm}' weights clients by their examples; set"
                      " algorithm.client_weighting: uniform")
    if role == COMPLETE and kind == PLAIN_SUM:
      raise UserError(f"{where}: algorithm '{algorithm}' sums client updates; this stage"
                      " averages them")


def is_compressing(registry: Registry, stage: Component) -> bool:
  """True for stages that change what crosses the wire (encoders): an
  uncompressed reference run leaves them out."""
  return bool(registry.get(stage.name).traits["compresses"])


@dataclasses.dataclass(frozen=True)
class PrivacyScope:
  """What a stage's privacy ledger needs beyond its own parameters."""

  population: int          # N: clients that can be sampled
  sample_size: int         # m: clients sampled per round (fixed-size sampling)
  clients_per_round: int   # clients aggregated per round (expected, with poisson)
  update_elements: int     # floats in one client's update (the model's trainable weights)
  poisson_rate: float | None = None  # q with `sampling: poisson`; None: fixed-size samples


class PrivacyLedgers:
  """The ledgers of a chain's differentially private stages, read as one."""

  def __init__(self, ledgers: Sequence[Any]):
    self.ledgers = tuple(ledgers)

  def round_metrics(self, rounds: int) -> dict[str, float]:
    """Every ledger's metrics after `rounds` rounds that aggregated."""
    return {k: v for ledger in self.ledgers for k, v in ledger.round_metrics(rounds).items()}


def privacy_ledgers(stages: Sequence[Component], scope: PrivacyScope) -> PrivacyLedgers | None:
  """The privacy each DP stage of `stages` spends, or None when none is private.

  A stage that spends privacy is registered with `privacy_ledger(params, scope)`,
  returning an object with `round_metrics(rounds) -> {name: value}`.
  """
  ledgers = [ledger(stage.params, scope) for stage in stages
             if (ledger := AGGREGATION_STAGES.get(stage.name).traits["privacy_ledger"])
             is not None]
  return PrivacyLedgers(ledgers) if ledgers else None


from fedsim.aggregation import builtin_stages, count_sketch, ddp, local_dp, majority  # noqa: E402,F401  (register fedsim's own stages)
