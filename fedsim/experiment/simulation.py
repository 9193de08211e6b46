"""Builds everything one run needs from a validated config (imports TF/TFF)."""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import types
from typing import Any, Callable

import numpy as np

from fedsim.aggregation import (AGGREGATION_STAGES, BROADCAST_STAGES, PrivacyLedgers,
                                PrivacyScope, is_compressing, privacy_ledgers)
from fedsim.algorithms import ALGORITHMS, FederatedAlgorithm, Task
from fedsim.control.engine import (Controlled, RoundControl, Variant, check_schedule,
                                   find_controlled, fixed_chain)
from fedsim.experiment.config.loader import parse_config, plain
from fedsim.experiment.config.schema import ExperimentConfig
from fedsim.data.federated import FederatedData
from fedsim.data.sampling import ClientSampler
from fedsim.errors import UserError
from fedsim.experiment.population import check_sample, training_data
from fedsim.experiment.round_clients import RoundClients
from fedsim.experiment.server_eval import make_evaluator
from fedsim.learning.buffered import BufferedAlgorithm
from fedsim.models.functional import TaskModel, build_task_model
from fedsim.registry import resolve
from fedsim.runtime.contract import RoundProcess
from fedsim.runtime.runtime_registry import RuntimeChoice, RuntimeContext, choose_runtime, runtime_of
from fedsim.sizing import ClientWireBits
from fedsim.sizing.mapreduce_form import client_wire_bits


@dataclasses.dataclass(frozen=True)
class Simulation:
  """A config made concrete: data, model, algorithm and its wire sizes."""

  config: ExperimentConfig
  data: FederatedData
  model: TaskModel
  algorithm: FederatedAlgorithm
  sampler: ClientSampler
  wire: ClientWireBits               # per client per round, as configured
  # The same algorithm without compression, sized when first asked for
  # (`uncompressed_wire`; only `fedsim run`'s summary does): its build and
  # compile are not paid before round 1, nor by runs nobody compares.
  size_uncompressed: Callable[[], ClientWireBits]
  evaluate: Any                      # weights -> {"eval/loss", "eval/accuracy"}
  # What the loop calls each round: what the configured runtime built (see
  # fedsim.runtime.contract), e.g. TFF's process or the compiled round.
  round_process: RoundProcess | None = None
  runtime_notice: str | None = None  # why the named runtime fell back to `local`
  # A buffered algorithm's client training (`BufferedAlgorithm.dispatch_process`),
  # on the same runtime; None for synchronous rounds.
  dispatch_process: RoundProcess | None = None
  # The privacy spent so far, when the aggregation chain is differentially private.
  privacy: PrivacyLedgers | None = None
  # (weights, round) -> eval_clients/* metrics, with `eval.federated` (client_eval.py).
  evaluate_clients: Any = None
  # A controlled encoder parameter's controller and variants (fedsim.control.engine).
  control: RoundControl | None = None

  @property
  def uncompressed_wire(self) -> ClientWireBits:
    """What the algorithm sends per client without its encoders (built and
    compiled on the first call in a process, see `_uncompressed_wire_bits`)."""
    return self.size_uncompressed()


def build_simulation(config: ExperimentConfig) -> Simulation:
  """Loads data and builds the model, process and sizing for `config`.

  Raises:
    UserError: bad combinations found only once data is loaded.
  """
  data = training_data(config)
  check_sample(config, data)
  model = _task_model(config, data)
  controlled = _controlled(config)
  fixed = (controlled, controlled.spec.initial) if controlled is not None else None
  algorithm = _build_algorithm(config, model, num_clients=len(data.client_ids), fixed=fixed)
  check_schedule(controlled, algorithm.schedule, config.algorithm.name)
  wire = _wire_bits(algorithm, _measures_own_bits(config))
  # The uncompressed reference (the same chains without their encoders) is
  # sized from its own compiled process too, when asked for.
  size_uncompressed = (functools.partial(_uncompressed_wire_bits, config, model,
                                         len(data.client_ids))
                       if _compresses(config) else lambda: wire)
  choice = _round_process(algorithm, config)
  round_process = choice.process
  dispatch = (choice.variant(algorithm.dispatch_round(), dispatch=True)
              if isinstance(algorithm, BufferedAlgorithm) else None)
  control = None
  if controlled is not None:
    control = RoundControl(
        controlled,
        build_algorithm=lambda value: _build_algorithm(config, model,
                                                       num_clients=len(data.client_ids),
                                                       fixed=(controlled, value)),
        build_process=lambda built, value: choice.variant(built, fixed=value),
        size=lambda built: _wire_bits(built, _measures_own_bits(config)),
        first=Variant(controlled.spec.initial, algorithm, None, None, round_process, wire))
  as_function = choice.function
  return Simulation(
      config=config, data=data, model=model, algorithm=algorithm,
      sampler=ClientSampler(data.client_ids, config.seed,
                            poisson_rate=config.poisson_rate(len(data.client_ids))),
      wire=wire, size_uncompressed=size_uncompressed,
      evaluate=make_evaluator(model, data, config.eval.batch_size, as_function),
      round_process=round_process, runtime_notice=choice.notice, dispatch_process=dispatch,
      privacy=_privacy_ledgers(config, len(data.client_ids), model.num_params),
      evaluate_clients=_client_evaluator(config, model, data, as_function), control=control)


def _controlled(config: ExperimentConfig) -> Controlled | None:
  """The controlled encoder parameter of `config`, if any (UserError: more than one)."""
  return find_controlled({"aggregation": config.aggregation_chain(),
                          "broadcast": config.broadcast_chain()})


def _client_evaluator(config, model, data, as_function):
  """The per-client evaluator of `eval.federated`, or None when it is off."""
  if not config.eval.federated:
    return None
  from fedsim.experiment.client_eval import make_client_evaluator
  sampler = ClientSampler(data.client_ids, config.seed,
                          poisson_rate=config.poisson_rate(len(data.client_ids)))
  count = config.clients_per_round + config.backup_clients
  # The round's own sample (the sampler is a pure function of seed and round).
  choose = ((lambda round_num: data.client_ids) if config.eval.federated_clients == "all"
            else (lambda round_num: sampler.sample(round_num, count)))
  return make_client_evaluator(model, data.client_test, config.eval.batch_size, choose,
                               as_function)


def _task_model(config: ExperimentConfig, data: FederatedData) -> TaskModel:
  try:
    return build_task_model(config.model, data.input_shape, data.num_classes, config.seed,
                            x_dtype=data.test.x.dtype, label_shape=data.test.y.shape[1:],
                            pad_label=data.pad_label, precision=_precision(config))
  except ValueError as e:
    raise UserError(f"model.name: {e}") from None


def _round_process(algorithm: FederatedAlgorithm, config: ExperimentConfig) -> RuntimeChoice:
  """The configured runtime (or `local`, see `choose_runtime`) with `algorithm`'s
  round built; a buffered algorithm's dispatch must run on it too.

  Raises:
    UserError, RunFailed: the runtime could not start (e.g. `ray` could not
      reach its cluster or start its workers).
  """
  rounds = [algorithm]
  if isinstance(algorithm, BufferedAlgorithm):
    rounds.append(algorithm.dispatch_round())
  context = RuntimeContext(worker_builder=functools.partial(cluster_worker, plain(config)))
  return choose_runtime(config.runtime.name, config.runtime.params, rounds, context)


def cluster_worker(plain_config: dict[str, Any], device: str, fixed: float | None = None,
                   dispatch: bool = False):
  """What one `ray` worker builds once from the resolved config (in the actor);
  `fixed`: the value of the config's controlled encoder parameter to build at
  (None: its initial value); `dispatch`: a buffered algorithm's client dispatch
  instead of its server update.

  Returns:
    (the compiled round, an `InProcessProcess`; `pack(round_num, ids)`, the
    clients' lazily packed `RoundClients`, packed alike on every host).
  """
  from fedsim.plugins import load_plugins
  from fedsim.runtime import inprocess
  load_plugins(plain_config.get("plugins"), ".")
  config = parse_config(plain_config)
  data = training_data(config)
  controlled = _controlled(config)
  at = None if controlled is None else (
      controlled, controlled.spec.initial if fixed is None else fixed)
  algorithm = _build_algorithm(config, _task_model(config, data),
                               num_clients=len(data.client_ids), fixed=at)
  # Packing reads only the config, the data and the algorithm's client plan.
  pieces = types.SimpleNamespace(config=config, data=data, algorithm=algorithm)
  process = algorithm.dispatch_round().process if dispatch else algorithm.process
  return (inprocess.InProcessProcess(process, device),
          lambda round_num, ids: RoundClients(pieces, round_num, ids))


# Uncompressed reference sizes by what they depend on: the types a build
# makes, not the run's seed or its initial weights' values (`_build_key`
# without them), so the seeds of an encoder sweep's variants share one.
_UNCOMPRESSED: collections.OrderedDict = collections.OrderedDict()


def _uncompressed_wire_bits(config, model, num_clients: int) -> ClientWireBits:
  """`_wire_bits` of the algorithm without its encoders: sized once per process
  for every variant and seed that differ only in their encoders, seed and
  initial weights' values (the algorithm is built for the first of them)."""
  task = _task(config, model, compressed=False, num_clients=num_clients)
  entry = ALGORITHMS.get(config.algorithm.name)
  key = _build_key(config, model, dataclasses.replace(task, seed=0), entry, values=False)
  return _kept(_UNCOMPRESSED, key, entry, lambda: _wire_bits(
      _build_algorithm(config, model, compressed=False, num_clients=num_clients)))


def _wire_bits(algorithm: FederatedAlgorithm, measured: bool = False) -> ClientWireBits:
  return client_wire_bits(algorithm.sizing_process or algorithm.process,
                          algorithm.upload_extras_types, measured)


def _measures_own_bits(config) -> bool:
  """An encode stage's encoder sends value-dependent shapes that the round measures."""
  from fedsim.compression import reports_own_bits
  return any(s.name == "encode" and reports_own_bits(s.params)
             for s in (*config.aggregation_chain(), *config.broadcast_chain()))


def _privacy_ledgers(config, population: int, update_elements: int) -> PrivacyLedgers | None:
  """What the chain's differentially private stages spend (None without one)."""
  return privacy_ledgers(config.aggregation_chain(), PrivacyScope(
      population=population, sample_size=config.clients_per_round + config.backup_clients,
      clients_per_round=config.clients_per_round, update_elements=update_elements,
      poisson_rate=config.poisson_rate(population)))


def _compresses(config) -> bool:
  return (any(is_compressing(AGGREGATION_STAGES, s) for s in config.aggregation_chain())
          or any(is_compressing(BROADCAST_STAGES, s) for s in config.broadcast_chain()))


# Built algorithms by everything a build reads (`_build_key`), so the runs of one
# configuration in a process (a run and its resume, a study's player, the
# uncompressed reference of an encoder sweep's variants, a notebook run again)
# build, compile to a MapReduceForm and compile the round once: together seconds
# per run, where the rounds of a small run take less. The compiled forms and
# rounds are cached by process object (fedsim.backend.mapreduce,
# fedsim.runtime.builtin), so they follow. The newest few are kept: each holds
# its compiled graphs.
_BUILT: collections.OrderedDict = collections.OrderedDict()
_BUILT_KEEP = 8


def _build_algorithm(config, model, compressed: bool = True, num_clients: int = 0,
                     fixed: tuple[Controlled, float] | None = None) -> FederatedAlgorithm:
  """The configured algorithm; with `compressed` False, its chains lose their encoders;
  `fixed`: (the controlled parameter, its value for this build)."""
  task = _task(config, model, compressed, num_clients, fixed)
  entry = ALGORITHMS.get(config.algorithm.name)
  key = _build_key(config, model, task, entry)
  return _kept(_BUILT, key, entry, lambda: entry.build(config.algorithm.params, task))


def _kept(cache: collections.OrderedDict, key: tuple, entry, make: Callable[[], Any]) -> Any:
  """`cache`'s value for `key` (a `_build_key`), made by `make()` if it has none;
  the newest `_BUILT_KEEP` are kept, each with its registry `entry`, so that the
  entry's id in the key stays its own."""
  if key in cache:
    cache.move_to_end(key)
    return cache[key][1]
  value = make()
  cache[key] = (entry, value)
  while len(cache) > _BUILT_KEEP:
    cache.popitem(last=False)
  return value


def _build_key(config, model: TaskModel, task: Task, entry, values: bool = True) -> tuple:
  """What an algorithm's build reads: its registry entry and parameters, and the
  task (every field but the model, and of the model what its functions are made
  of: the model's config and builder, its precision, its types and, with
  `values`, its initial weights' values)."""
  builder = getattr(config.model.params, "builder", None)
  # The function itself (hashed by identity), so the key keeps it alive: a
  # reloaded module's new function can never take a collected one's id.
  code = resolve(builder, key="model") if isinstance(builder, str) and builder else None
  digest = hashlib.sha256()
  weights = (*model.initial_weights.trainable, *model.initial_weights.non_trainable)
  for array in weights if values else ():
    array = np.ascontiguousarray(array)
    digest.update(f"{array.dtype}{array.shape}".encode())
    digest.update(array.data)
  return (id(entry), repr(config.algorithm), repr(config.model), code, _precision(config),
          repr(model.weights_type), model.input_shape, model.num_classes,
          np.dtype(model.x_dtype).str, model.label_shape, model.pad_label, digest.hexdigest(), repr(dataclasses.replace(task, model=None)))


def _precision(config: ExperimentConfig) -> str:
  return runtime_of(config.runtime.name).precision(config.runtime.params)


def _task(config, model, compressed: bool, num_clients: int,
          fixed: tuple[Controlled, float] | None = None) -> Task:
  """What the configured algorithm is built for (without encoders unless `compressed`;
  with the controlled parameter at `fixed`'s value)."""
  aggregation, broadcast = config.aggregation_chain(), config.broadcast_chain()
  if fixed is not None:
    controlled, value = fixed
    if controlled.direction == "aggregation":
      aggregation = fixed_chain(aggregation, controlled, value)
    else:
      broadcast = fixed_chain(broadcast, controlled, value)
  if not compressed:
    aggregation = tuple(s for s in aggregation if not is_compressing(AGGREGATION_STAGES, s))
    broadcast = tuple(s for s in broadcast if not is_compressing(BROADCAST_STAGES, s))
  return Task(model=model, batch_size=config.data.params.batch_size,
              epochs=config.data.params.epochs, aggregation=aggregation, broadcast=broadcast,
              clients_per_round=config.clients_per_round, seed=config.seed,
              num_clients=num_clients)
