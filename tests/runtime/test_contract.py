"""The runtime contract: every runtime's round is a RoundProcess, one function picks
the runtime (or `local`, with one notice), and TFF's own process is wrapped so that
callers never look at its type; FedBuff's clients train on the runtime like any round."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import fedsim
from fedsim.runtime.contract import RoundProcess
from fedsim.runtime.runtime_registry import (RUNTIMES, Runtime, RuntimeContext, Unsupported,
                                             choose_runtime, register_runtime)
from fedsim.task import ClientPlan, FederatedAlgorithm


def _sum_process():
  """next(state@S, x@C) -> (state + sum x, sum x): a TFF process of int32s."""
  import tensorflow_federated as tff

  @tff.federated_computation
  def initialize():
    return tff.federated_value(np.int32(0), tff.SERVER)

  @tff.tensorflow.computation(np.int32, np.int32)
  def add(a, b):
    return a + b

  @tff.federated_computation(tff.FederatedType(np.int32, tff.SERVER),
                             tff.FederatedType(np.int32, tff.CLIENTS))
  def next_fn(state, values):
    total = tff.federated_sum(values)
    return tff.federated_map(add, (state, total)), total

  return tff.templates.IterativeProcess(initialize, next_fn)


class _Lazy:
  """A sequence of clients that is no list (as RoundClients), counting reads."""

  def __init__(self, values):
    self.values, self.reads = values, 0

  def __len__(self):
    return len(self.values)

  def __iter__(self):
    self.reads += 1
    return iter(self.values)


def test_tff_process_gives_tff_a_list_and_checks_client_states(tff_runtime):
  from fedsim.runtime.tff_process import TffProcess
  process = TffProcess(_sum_process())
  assert isinstance(process, RoundProcess)
  assert (process.stateful_clients, process.client_outputs, process.phases) == (False, False, None)
  clients = _Lazy([np.int32(2), np.int32(5)])
  state, total = process.next(process.initialize(), clients)
  assert (int(state), int(total), clients.reads) == (7, 7, 1)
  with pytest.raises(ValueError, match="client states are needed exactly when"):
    process.next(state, clients, [(), ()])
  process.close()  # nothing to release; the contract's default


@dataclasses.dataclass
class _Fake(Runtime):
  reason: str | None = None
  late: bool = False          # supports, then build raises Unsupported
  returns: object = None      # what build returns
  quiet_fallback: bool = False

  def supports(self, algorithm, params):
    return self.reason

  def build(self, algorithm, params, context):
    if self.late:
      raise Unsupported("found out while building")
    return self.returns


@pytest.fixture
def fakes():
  made = []

  def make(name, **kwargs):
    register_runtime(name, _Fake(**kwargs))
    made.append(name)
    return name

  yield make
  for name in made:
    RUNTIMES._entries.pop(name, None)  # registries are process-wide


def test_one_function_picks_the_runtime_or_local_with_one_notice(fakes):
  from fedsim.runtime.tff_process import TffProcess
  algorithm = FederatedAlgorithm(process=_sum_process(), client_plan=ClientPlan())
  context = RuntimeContext()

  class Own(RoundProcess):
    stateful_clients = False

    def initialize(self):
      return 0

    def next(self, state, clients, client_states=None):
      return state, {}

  own = Own()
  chosen = choose_runtime(fakes("test_own", returns=own), None, [algorithm], context)
  assert chosen.process is own and chosen.notice is None
  for name, why in ((fakes("test_refuses", reason="no secure sums"), "no secure sums"),
                    (fakes("test_late", late=True), "found out while building")):
    chosen = choose_runtime(name, None, [algorithm], context)
    assert isinstance(chosen.process, TffProcess) and chosen.process.process is algorithm.process
    assert chosen.notice == f"runtime.name: {name} cannot run this algorithm ({why}); using local"
  # Any of the run's rounds refused: all run on local (a buffered dispatch included).
  second = FederatedAlgorithm(process=_sum_process(), client_plan=ClientPlan())
  picky = fakes("test_picky", returns=own)
  RUNTIMES.get(picky).build.supports = lambda a, p: "not that one" if a is second else None
  chosen = choose_runtime(picky, None, [algorithm, second], context)
  assert isinstance(chosen.process, TffProcess) and "(not that one)" in chosen.notice
  quiet = choose_runtime(fakes("test_quiet", reason="no", quiet_fallback=True), None,
                         [algorithm], context)
  assert isinstance(quiet.process, TffProcess) and quiet.notice is None
  with pytest.raises(TypeError, match="build returned a dict, not a"):
    choose_runtime(fakes("test_untyped", returns={}), None, [algorithm], context)


FEDBUFF = {
    "name": "fedbuff", "seed": 4, "rounds": 3, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 8, "partition": "dirichlet", "alpha": 1.0,
             "batch_size": 16},
    "model": {"name": "logistic"}, "eval": {"every": 1},
    "algorithm": {"name": "fedbuff", "local_steps": 2, "concurrency": 5, "max_staleness": 2},
    # The dispatch downloads through a stateful 8-bit encoder (deterministic: an
    # ulp cannot redraw stochastic rounding's noise).
    "compression": {"broadcast": {"encoder": "uniform", "bits": 8, "min_elements": 1,
                                  "rounding": "deterministic"}},
    "system": {"speed": "lognormal", "sigma": 0.5},
}


@pytest.mark.slow
def test_fedbuff_clients_train_compiled_on_inprocess_and_equal_local(tff_runtime, tmp_path,
                                                                     capsys):
  from fedsim.experiment.config.loader import parse_config
  from fedsim.experiment.simulation import build_simulation
  from fedsim.runtime.inprocess import InProcessProcess
  config = {**FEDBUFF, "runtime": {"name": "inprocess", "device": "cpu"}}
  sim = build_simulation(parse_config(config))
  assert isinstance(sim.dispatch_process, InProcessProcess)
  assert sim.dispatch_process.client_outputs and not sim.dispatch_process.stateful_clients
  got = fedsim.run(config, logdir=tmp_path / "inprocess", progress=False)
  want = fedsim.run({**FEDBUFF, "runtime": {"name": "local"}}, logdir=tmp_path / "local",
                    progress=False)
  assert "using local" not in capsys.readouterr().err
  assert max(r["staleness/max"] for r in want.metrics) > 0  # really asynchronous
  for g, w in zip(got.final_weights, want.final_weights, strict=True):
    np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
  for g, w in zip(got.metrics, want.metrics, strict=True):
    for key in ("train/loss", "eval/loss", "eval/accuracy", "simulated_seconds",
                "broadcast_bits", "aggregate_bits", "staleness/mean"):
      np.testing.assert_allclose(g[key], w[key], rtol=0, atol=1e-6, err_msg=key)
