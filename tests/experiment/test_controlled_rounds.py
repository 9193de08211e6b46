"""A controlled encoder parameter in real runs: each client runs, is sized and is
timed at its own value, and a run with a controller resumes bit for bit.

The references are computed apart from the controlled run: fixed-value runs
(each sized from its own compiled round), single-value rounds on subsets of
the clients combined by hand into FedAvg's weighted mean, and the clock's
round time from the profile's links and the logged bits.
"""

from __future__ import annotations

import csv
import dataclasses
import math

import numpy as np
import pytest

import fedsim
from fedsim.compression import parse_direction
from fedsim.control import CONTROLLERS, register_controller
from fedsim.errors import UserError


@dataclasses.dataclass(frozen=True)
class AlternateParams:
  low: int = 2
  high: int = 8


class _Alternate:
  """Sampled clients alternate between `low` and `high`; counts its calls."""

  def __init__(self, params):
    self.params = params

  def initial_state(self):
    return {"calls": 0}

  def decide(self, state, view):
    values = {c.id: self.params.low if i % 2 == 0 else self.params.high
              for i, c in enumerate(view.clients)}
    return {"calls": state["calls"] + 1}, values


def _alternate(params):
  """Test: clients alternate between two values."""
  return _Alternate(params)


@dataclasses.dataclass(frozen=True)
class StepParams:
  at: int = 3


class _Step:
  """The initial value until the training loss has fallen in `at` rounds, the
  maximum from then on: what it decides depends on its state, so a resume that
  lost the state would decide otherwise."""

  def __init__(self, params):
    self.params = params

  def initial_state(self):
    return {"fell": 0, "last": None}

  def decide(self, state, view):
    loss = view.history[-1]["train/loss"] if view.history else None
    fell = state["fell"] + int(loss is not None and state["last"] is not None
                               and loss < state["last"])
    value = view.knob.maximum if fell >= self.params.at else view.knob.initial
    return {"fell": fell, "last": loss}, value


def _step(params):
  """Test: the initial value, then the maximum once the loss has fallen `at` times."""
  return _Step(params)


@pytest.fixture(scope="module", autouse=True)
def _test_controllers():
  """This module's controllers, registered while its tests run (registries are
  process-wide: `fedsim list` in later tests must not show them)."""
  register_controller("test_alternate", params=AlternateParams, replace=True)(_alternate)
  register_controller("test_step", params=StepParams, replace=True)(_step)
  yield
  for name in ("test_alternate", "test_step"):
    CONTROLLERS._entries.pop(name, None)


def _config(bits, **extra):
  return {
      "name": "controlled", "seed": 3, "rounds": 4, "clients_per_round": 4,
      "data": {"name": "digits", "num_clients": 8, "batch_size": 16},
      "model": {"name": "logistic"},
      "algorithm": {"name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": 0.1}},
      "aggregation": [{"name": "encode", "encoder": "uniform", "bits": bits,
                       "rounding": "deterministic", "min_elements": 100}],
      "runtime": {"name": "inprocess", "device": "cpu"}, "eval": {"every": 2},
      **extra}


def _clients_rows(run_dir):
  with open(run_dir / "clients.csv", newline="") as f:
    return list(csv.DictReader(f))


def _rows(result):
  return [{k: v for k, v in r.items() if k != "round_seconds"} for r in result.metrics]


def test_parsing_names_the_culprit():
  spec = parse_direction({"encoder": "uniform", "bits": {"controller": "test_step", "initial": 2,
                                                         "max": 6, "at": 2}}, "aggregation[0]")
  assert spec.encoder.params.bits == 2
  assert (spec.control.param, spec.control.minimum, spec.control.maximum) == ("bits", 1, 6)
  assert spec.control.controller.params.at == 2
  assert parse_direction(spec.to_dict(), "aggregation[0]") == spec
  bad = [
      ({"encoder": "uniform", "bits": {"controller": "nope"}}, "aggregation[0].bits.controller"),
      ({"encoder": "uniform", "rounding": {"controller": "test_step"}},
       "aggregation[0].rounding: encoder 'uniform' parameter 'rounding' is not a number"),
      ({"encoder": "uniform", "bits": {"controller": "test_step", "max": 40}},
       "aggregation[0]"),
      ({"encoder": "uniform", "bits": {"controller": "test_step", "initial": 2.5}},
       "aggregation[0].bits.initial: 'bits' is an integer"),
      ({"encoder": "uniform", "bits": {"controller": "test_step", "nope": 1}},
       "aggregation[0].bits.nope"),
      ({"encoder": "topk", "fraction": {"controller": "test_step", "max": 0.5}},
       "aggregation[0].fraction.min: required"),
  ]
  for data, message in bad:
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
      parse_direction(data, "aggregation[0]")


@pytest.mark.slow
def test_a_constant_controller_is_the_fixed_run_and_a_step_resumes_bit_for_bit(tmp_path):
  fixed = fedsim.run(_config(2), logdir=tmp_path / "fixed", progress=False)
  held = fedsim.run(_config({"controller": "test_step", "initial": 2, "max": 6, "at": 99}),
                    logdir=tmp_path / "held", progress=False)
  for got, want in zip(held.final_weights, fixed.final_weights):
    np.testing.assert_array_equal(got, want)
  assert [r["aggregate_bits"] for r in held.metrics] == [
      r["aggregate_bits"] for r in fixed.metrics]
  assert all(r["control/bits_mean"] == 2 for r in held.metrics)

  # The loss falls from round 2 to 3 and 3 to 4: the state has counted two falls
  # by round 4's decision, one of them seen only by the state saved at round 2.
  step = _config({"controller": "test_step", "initial": 2, "max": 6, "at": 2})
  whole = fedsim.run(step, logdir=tmp_path / "whole", progress=False)
  assert [r["control/bits_max"] for r in whole.metrics] == [2, 2, 2, 6]
  # Six bits per element cost more than two.
  assert whole.metrics[3]["aggregate_bits"] > whole.metrics[2]["aggregate_bits"]
  half = fedsim.run(step, ["rounds=2", "checkpoint.every=2"], logdir=tmp_path / "parts",
                    progress=False)
  resumed = fedsim.run(step, logdir=tmp_path / "parts", progress=False, resume=half.run_dir)
  assert _rows(resumed) == _rows(whole)
  for got, want in zip(resumed.final_weights, whole.final_weights):
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_per_client_values_are_sized_timed_and_summed_as_fedavg(tmp_path):
  # Fixed links and compute: the clock is a hand computation.
  up, down, latency, per_example = 2e5, 1e6, 0.05, 0.001
  system = {"seconds_per_example": per_example, "profiles": {
      "up_bps": {"median": up, "sigma": 0.0}, "down_bps": {"median": down, "sigma": 0.0},
      "latency_s": {"median": latency, "sigma": 0.0}}}
  config = _config({"controller": "test_alternate", "low": 2, "high": 8, "initial": 2},
                   rounds=2, system=system)
  mixed = fedsim.run(config, logdir=tmp_path / "mixed", progress=False)
  fixed = {b: fedsim.run(_config(b, rounds=1, system=system), logdir=tmp_path / f"b{b}",
                         progress=False).metrics[0] for b in (2, 8)}
  sizes = {b: row["aggregate_bits_per_client"] for b, row in fixed.items()}
  model = {b: row["aggregate_model_bits_per_client"] for b, row in fixed.items()}
  # The logistic kernel (640 elements) is the one encoded tensor: its symbols
  # packed 28 bits to an int32 word; everything else is sent alike at any bits.
  assert sizes[8] - sizes[2] == (math.ceil(640 * 8 / 28) - math.ceil(640 * 2 / 28)) * 32
  for row, metrics in zip(_clients_rows(mixed.run_dir), mixed.metrics):
    ids = row["aggregated"].split()
    values = [int(v) for v in row["value"].split()]
    bits = [int(b) for b in row["upload_bits"].split()]
    assert values == [2 if i % 2 == 0 else 8 for i in range(len(ids))]
    assert bits == [sizes[v] for v in values]
    assert metrics["aggregate_bits"] == sum(bits)
    # The model's part of the mean upload: the mean of each client's own.
    assert metrics["aggregate_model_bits_per_client"] == pytest.approx(
        sum(model[v] for v in values) / len(values), rel=1e-12)
    # Each client: download, compute, upload at its own bits; the round waits for the last.
    download = metrics["broadcast_bits_per_client"]
    examples = _examples(config, mixed.run_dir, row["round"], ids)
    expected = max(download / down + latency + n * per_example + b / up + latency
                   for n, b in zip(examples, bits))
    assert metrics["round_simulated_seconds"] == pytest.approx(expected, rel=1e-12)


def _examples(config, run_dir, round_num, ids):
  """Examples each client trained on in that round, from the data (one epoch)."""
  from fedsim.data import DATASETS
  from fedsim.experiment.config.loader import parse_config
  parsed = parse_config(config)
  data = DATASETS.get(parsed.data.name).build(parsed.data.params, parsed.seed)
  del run_dir, round_num
  return [data.client_size(cid) for cid in ids]


@pytest.mark.slow
def test_a_mixed_round_is_the_weighted_mean_of_its_groups(tff_runtime):
  """One round whose clients run at 2 and 8 bits equals FedAvg's weighted mean of
  the two groups' single-value rounds from the same state."""
  del tff_runtime
  from fedsim.experiment.config.loader import parse_config
  from fedsim.experiment.round_clients import RoundClients
  from fedsim.experiment.simulation import build_simulation
  from fedsim.runtime.mixed import next_mixed
  sim = build_simulation(parse_config(_config(
      {"controller": "test_alternate", "low": 2, "high": 8, "initial": 2})))
  ids = sim.sampler.sample(1, 4)
  clients = RoundClients(sim, 1, ids)
  low, high = sim.control.variant(2).process, sim.control.variant(8).process
  state = low.initialize()
  groups = {2: list(ids[0::2]), 8: list(ids[1::2])}
  mixed, _ = next_mixed([(low, clients.only(groups[2]), None),
                         (high, clients.only(groups[8]), None)], state)
  weights = clients.num_examples()
  start = [np.asarray(w) for w in sim.algorithm.model_weights(state).trainable]
  total = sum(weights.values())
  expected = [np.zeros_like(w) for w in start]
  for value, process in ((2, low), (8, high)):
    alone, _ = process.next(state, clients.only(groups[value]))
    share = sum(weights[c] for c in groups[value]) / total
    for e, w, s in zip(expected, sim.algorithm.model_weights(alone).trainable, start):
      e += share * (np.asarray(w) - s)
  got = [np.asarray(w) for w in sim.algorithm.model_weights(mixed).trainable]
  for g, s, e in zip(got, start, expected):
    np.testing.assert_allclose(g - s, e, atol=1e-6)
  assert not np.allclose(got[0], [np.asarray(w) for w in sim.algorithm.model_weights(
      low.next(state, clients)[0]).trainable][0], atol=1e-6)


def test_local_runtime_refuses_a_mixed_round_in_one_line(tff_runtime, tmp_path):
  del tff_runtime
  config = _config({"controller": "test_alternate", "initial": 2}, rounds=1,
                   runtime={"name": "local"})
  with pytest.raises(UserError, match="runtime.name: local runs one encoder setting per round"):
    fedsim.run(config, logdir=tmp_path, progress=False)


@pytest.mark.slow
def test_a_mixed_round_with_error_feedback_gives_each_client_its_own_residual(tff_runtime):
  """Clients keep their residuals: in a round of 2- and 8-bit clients each one's
  new residual is what its own value's round gives it alone."""
  del tff_runtime
  from fedsim.experiment.config.loader import parse_config
  from fedsim.experiment.round_clients import RoundClients
  from fedsim.experiment.simulation import build_simulation
  from fedsim.runtime.mixed import next_mixed
  config = _config({"controller": "test_alternate", "low": 2, "high": 8, "initial": 2})
  config["aggregation"][0]["error_feedback"] = True
  sim = build_simulation(parse_config(config))
  ids = sim.sampler.sample(1, 4)
  clients = RoundClients(sim, 1, ids)
  low, high = sim.control.variant(2).process, sim.control.variant(8).process
  state = low.initialize()
  zero = sim.algorithm.initial_client_state
  groups = {2: list(ids[0::2]), 8: list(ids[1::2])}
  _, _, new_states = next_mixed(
      [(low, clients.only(groups[2]), [zero] * 2), (high, clients.only(groups[8]), [zero] * 2)],
      state)
  alone = [*low.next(state, clients.only(groups[2]), [zero] * 2)[2],
           *high.next(state, clients.only(groups[8]), [zero] * 2)[2]]
  import tensorflow as tf
  for got, want in zip(new_states, alone, strict=True):
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want), strict=True):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-7)
  # Two bits leave a larger residual than eight.
  norms = [np.linalg.norm(np.concatenate([np.ravel(x) for x in tf.nest.flatten(s)]))
           for s in new_states]
  assert min(norms[:2]) > max(norms[2:])


# (encoder, its numeric parameter, two values, other keys): the list.
# Uniform's bits differing between clients is also what
# test_per_client_values_are_sized_timed_and_summed_as_fedavg runs (with exact
# sizes), so its case here is one of the `-m long` ones.
CONTROLLABLE = [
    pytest.param("uniform", "bits", (2, 8), {}, marks=pytest.mark.long),
    ("hadamard", "bits", (2, 6), {}),
    ("qsgd", "levels", (1, 15), {}),
    ("topk", "fraction", (0.01, 0.2), {}),
    pytest.param("eden", "bits", (1, 3), {}, marks=pytest.mark.long),
    pytest.param("randk", "fraction", (0.05, 0.3), {}, marks=pytest.mark.long),
    pytest.param("threshold", "tau", (0.001, 0.1), {}, marks=pytest.mark.long),
    pytest.param("kashin", "bits", (1, 4), {}, marks=pytest.mark.long),
]


@pytest.mark.slow
@pytest.mark.parametrize("encoder,param,values,extra", CONTROLLABLE)
def test_every_numeric_encoder_parameter_can_differ_between_clients(tff_runtime, encoder, param,
                                                                     values, extra):
  """Clients at either value run one mixed round: the state is the same type,
  the groups merge, and the larger value sends more (or, for threshold's tau,
  the smaller)."""
  del tff_runtime
  from fedsim.experiment.config.loader import parse_config
  from fedsim.experiment.round_clients import RoundClients
  from fedsim.experiment.simulation import build_simulation
  from fedsim.runtime.mixed import next_mixed
  low, high = values
  config = _config(2)
  stage = {"name": "encode", "encoder": encoder, "min_elements": 100, **extra,
           param: {"controller": "test_alternate", "initial": low, "min": low, "max": high}}
  config["aggregation"] = [stage]
  sim = build_simulation(parse_config(config))
  ids = sim.sampler.sample(1, 4)
  clients = RoundClients(sim, 1, ids)
  first, second = sim.control.variant(low), sim.control.variant(high)
  state = first.process.initialize()
  new_state, measurements = next_mixed(
      [(first.process, clients.only(ids[0::2]), None),
       (second.process, clients.only(ids[1::2]), None)], state)
  weights = [np.asarray(w) for w in sim.algorithm.model_weights(new_state).trainable]
  assert all(np.isfinite(w).all() for w in weights)
  assert not np.array_equal(weights[0], np.asarray(
      sim.algorithm.model_weights(state).trainable[0]))
  if encoder != "threshold":  # its size depends on the values: measured, not static
    assert second.wire.aggregate > first.wire.aggregate
