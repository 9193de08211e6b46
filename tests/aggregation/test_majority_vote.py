"""signSGD with majority vote (Bernstein et al. 2018/2019) against a NumPy reference
of the paper's rule, and its upload: one bit per coordinate, packed 32 to an int32."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.aggregation import parse_aggregation
from fedsim.errors import UserError

SHAPES = [(7, 9), (40,)]   # 63 and 40 coordinates: neither a multiple of 32


def _clients(count):
  rng = np.random.default_rng(count)
  clients = [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(count)]
  clients[0][0][0, :4] = 0.0   # a zero coordinate votes +1
  return clients


def _reference(clients, step):
  """step * sign(sum_i sign(u_i)), sign(u) = +1 for u >= 0 and -1 below (1 bit), sign(0 sum) = 0."""
  out = []
  for t in range(len(SHAPES)):
    votes = sum(np.where(c[t] >= 0, 1, -1) for c in clients)
    out.append(step * np.sign(votes).astype(np.float32))
  return out


@pytest.fixture(scope="module")
def value_type():
  import tensorflow_federated as tff
  return tff.StructWithPythonType([tff.TensorType(np.float32, s) for s in SHAPES], list)


@pytest.mark.parametrize("count", [3, 4, 5])
def test_vote_is_the_sign_of_the_sum_of_signs(tff_runtime, value_type, count):
  from fedsim.aggregation.chain import build_chain
  factory, plan = build_chain(parse_aggregation([{"name": "majority_vote", "step": 0.25}]),
                              "mean", count, 0)
  assert plan == (("majority_vote", None, None),)
  process = factory.create(value_type)
  clients = _clients(count)
  output = process.next(process.initialize(), clients)
  want = _reference(clients, 0.25)
  for got, expected in zip(output.result, want):
    np.testing.assert_array_equal(got, expected)
  ties = sum(int(np.sum(w == 0)) for w in want)
  assert (ties > 0) == (count % 2 == 0)   # only an even number of clients can tie
  assert output.measurements["tie_fraction"] == pytest.approx(ties / 103)


def test_upload_is_one_bit_per_coordinate(value_type):
  """The clients' `work` output in the compiled round: ceil(n / 32) int32 words per tensor."""
  import tensorflow_federated as tff
  from fedsim.aggregation.vote import SignVoteFactory
  from fedsim.backend.mapreduce import compile_form
  from fedsim.sizing.mapreduce_form import type_bits
  process = SignVoteFactory(1.0).create(value_type)

  @tff.federated_computation(process.initialize.type_signature.result,
                             tff.FederatedType(value_type, tff.CLIENTS))
  def round_fn(state, value):   # the two-in, two-out shape a MapReduceForm needs
    output = process.next(state, value)
    return output.state, output.result

  form = compile_form(round_fn)   # as a run compiles it
  upload = form.work.type_signature.result[0]
  # 63 coordinates -> 2 words, 40 -> 2 words: 128 bits for 103 coordinates (the
  # last word of each tensor is padding); no scale, no header.
  assert type_bits(upload) == 2 * 32 + 2 * 32


def test_pack_and_unpack_in_numpy_terms():
  import tensorflow as tf
  from fedsim.aggregation.vote import pack_signs, unpack_votes
  x = np.random.default_rng(3).normal(size=70).astype(np.float32)
  words = pack_signs(tf.constant(x)).numpy()
  bits = np.zeros(96, np.uint64)
  bits[:70] = x >= 0
  expected = (bits.reshape(3, 32) << np.arange(32, dtype=np.uint64)).sum(axis=1)
  np.testing.assert_array_equal(words.view(np.uint32), expected.astype(np.uint32))
  np.testing.assert_array_equal(unpack_votes(tf.constant(words), 70).numpy(),
                                np.where(x >= 0, 1, -1))


@pytest.mark.parametrize("stage, message", [
    ({"name": "majority_vote", "step": 0}, r"aggregation\[0\]\.step: must be > 0"),
    ({"name": "majority_vote", "stpe": 1}, r"aggregation\[0\]\.stpe: unknown key"),
])
def test_bad_parameters_are_one_line(stage, message):
  with pytest.raises(UserError, match=message):
    parse_aggregation([stage])


CONFIG = {
    "name": "vote", "seed": 1, "rounds": 2, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 6, "batch_size": 16},
    "model": {"name": "logistic"},
    "algorithm": {"name": "fedavg", "client_weighting": "uniform",
                  "server_optimizer": {"name": "sgd", "learning_rate": 0.01}},
    "aggregation": [{"name": "majority_vote"}],
    "runtime": {"name": "inprocess"},
}


def test_validate_refuses_example_weighted_votes():
  import fedsim
  fedsim.validate(CONFIG)
  with pytest.raises(UserError, match=r"^aggregation\[0\] majority_vote: gives each client one"
                     r" vote.*set algorithm.client_weighting: uniform$"):
    fedsim.validate(dict(CONFIG, algorithm={"name": "fedavg"}))


@pytest.mark.slow
def test_fedavg_with_majority_vote_runs_and_sizes_its_upload(tmp_path):
  import fedsim
  config = dict(CONFIG)
  result = fedsim.run(config, logdir=tmp_path, progress=False)
  final = result.final
  # The logistic model's 64 x 10 kernel and 10 biases: 20 + 1 words of 32 bits.
  assert final["aggregate_model_bits_per_client"] == 672
  assert final["aggregation/majority_vote/tie_fraction"] == 0   # 3 voters never tie
  # Round 2 moved every weight by exactly +-0.01 (learning rate x vote).
  after_one = fedsim.run(config, ["rounds=1"], logdir=tmp_path / "one",
                         progress=False).final_weights
  for before, after in zip(after_one, result.final_weights):
    np.testing.assert_allclose(np.abs(after - before), 0.01, rtol=1e-3)
