"""Noise derived from (run seed, round, tensor, values): the same value encoded in
two rounds draws different noise, a round repeated from its state draws the same."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.compression import parse_direction

N, SEED = 200, 5


@pytest.fixture(scope="module", autouse=True)
def _runtime(tff_runtime):
  yield tff_runtime


def _spec(**extra):
  return parse_direction({"encoder": "qsgd", "levels": 3, "min_elements": 10, **extra}, "c")


def test_an_upload_repeated_in_the_next_round_draws_new_noise():
  import tensorflow_federated as tff
  from fedsim.compression.mean import build_encoded_sum
  process = build_encoded_sum(_spec(), SEED).create(tff.TensorType(np.float32, [N]))
  value = np.random.default_rng(0).normal(size=N).astype(np.float32)
  first = process.next(process.initialize(), [value])
  again = process.next(process.initialize(), [value])
  second = process.next(first.state, [value])
  assert first.state["round"] == 1 and second.state["round"] == 2
  np.testing.assert_array_equal(first.result, again.result)
  assert not np.array_equal(first.result, second.result)
  # Two clients with the same value in one round still draw the same noise.
  both = process.next(process.initialize(), [value, value])
  np.testing.assert_array_equal(both.result, 2 * first.result)


def test_error_feedback_uploads_leave_the_round_out():
  import tensorflow_federated as tff
  from fedsim.compression.mean import build_encoded_sum
  process = build_encoded_sum(_spec(error_feedback=True), SEED).create(
      tff.TensorType(np.float32, [N]))
  value = np.random.default_rng(1).normal(size=N).astype(np.float32)
  first = process.next(process.initialize(), [value])
  second = process.next(first.state, [value])
  np.testing.assert_array_equal(first.result, second.result)


def test_a_broadcast_repeated_in_the_next_round_draws_new_noise():
  import tensorflow_federated as tff
  from fedsim.compression.broadcast import build_encoded_broadcast
  spec = parse_direction({"encoder": "hadamard", "bits": 2, "min_elements": 10}, "b")
  value_type = tff.TensorType(np.float32, [N])
  process = build_encoded_broadcast(value_type, spec, seed=SEED)

  @tff.federated_computation(process.initialize.type_signature.result,
                             tff.FederatedType(value_type, tff.SERVER),
                             tff.FederatedType(np.float32, tff.CLIENTS))
  def send(state, value, client_marker):   # the marker fixes one client
    out = process.next(state, value)
    return out.state, tff.federated_zip((out.result, client_marker))

  value = np.random.default_rng(2).normal(size=N).astype(np.float32)
  state, [(first, _)] = send(process.initialize(), value, [0.0])
  _, [(again, _)] = send(process.initialize(), value, [0.0])
  _, [(second, _)] = send(state, value, [0.0])
  np.testing.assert_array_equal(first, again)
  assert not np.array_equal(first, second)
