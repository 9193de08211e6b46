"""Error feedback (Seide et al. 2014; Karimireddy et al. 2019): a client's local
C(u + e) is exactly what the aggregation's encoded sum decodes, and three rounds
of EF with top-k follow a NumPy reference written from the papers' rule."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.compression import parse_direction

N, K, SEED = 40, 4, 11   # 40-element update, top-4 kept


@pytest.fixture(scope="module", autouse=True)
def _runtime(tff_runtime):
  yield tff_runtime


def _spec(encoder="topk", **params):
  return parse_direction({"encoder": encoder, "min_elements": 10, **params}, "aggregation[0]")


def _local_step(spec):
  """A TFF computation (update, residual) -> (sent, decoded, new residual)."""
  import tensorflow as tf
  import tensorflow_federated as tff
  from fedsim.compression.feedback import local_decode
  vec = tf.TensorSpec([N], tf.float32)

  def step(u, e):
    sent = u + e
    decoded = local_decode(sent, spec, SEED)
    return sent, decoded, sent - decoded
  return tff.tensorflow.computation(step, vec, vec)


def _server_sum(spec):
  """The aggregation an `error_feedback: true` encode stage builds (its noise
  leaves the round out, as the client's own encoding does)."""
  import dataclasses
  import tensorflow_federated as tff
  from fedsim.compression.mean import build_encoded_sum
  spec = dataclasses.replace(spec, error_feedback=True)
  return build_encoded_sum(spec, SEED).create(tff.TensorType(np.float32, [N]))


def _top_k(x, k):
  """The papers' top-k: keep the k largest |x_i|, zero the rest."""
  out = np.zeros_like(x)
  keep = np.argsort(-np.abs(x))[:k]
  out[keep] = x[keep]
  return out


@pytest.mark.parametrize("encoder,params", [("topk", {"k": K}),
                                            ("qsgd", {}), ("hadamard", {"bits": 2})])
def test_server_decodes_exactly_what_the_client_computed(encoder, params):
  spec = _spec(encoder, **params)
  step, server = _local_step(spec), _server_sum(spec)
  rng = np.random.default_rng(0)
  updates = rng.normal(size=(2, N)).astype(np.float32)
  residuals = rng.normal(scale=0.1, size=(2, N)).astype(np.float32)
  outs = [step(u, e) for u, e in zip(updates, residuals)]
  for (sent, decoded, new_residual), u, e in zip(outs, updates, residuals):
    np.testing.assert_array_equal(sent, u + e)
    assert not np.array_equal(decoded, sent)   # the encoder really dropped something
    np.testing.assert_array_equal(np.asarray(new_residual), sent - decoded)
  total = server.next(server.initialize(), [o[0] for o in outs]).result
  # Two summands: the server's float sum of decodes is exact up to order, and
  # a + b == b + a; stages that decode after the sum (the Hadamard rotation)
  # are linear but round differently.
  expected = outs[0][1] + outs[1][1]
  if encoder == "hadamard":
    np.testing.assert_allclose(total, expected, rtol=0, atol=1e-5)
  else:
    np.testing.assert_array_equal(total, expected)


def test_top_k_residuals_match_numpy_over_three_rounds_with_an_absent_client():
  spec = _spec("topk", k=K)
  step, server = _local_step(spec), _server_sum(spec)
  rng = np.random.default_rng(3)
  participants = [(0, 1, 2), (0, 1), (0, 1, 2)]   # client 2 sits out round 2
  residual = np.zeros((3, N), np.float32)
  reference = np.zeros((3, N), np.float32)
  state = server.initialize()
  for round_clients in participants:
    updates = {c: rng.normal(size=N).astype(np.float32) for c in round_clients}
    sent, expected_sum = [], np.zeros(N, np.float32)
    for c in round_clients:
      value, decoded, residual[c] = step(updates[c], residual[c])
      sent.append(value)
      # Reference: p = u + e, send top_k(p), keep e = p - top_k(p).
      p = updates[c] + reference[c]
      compressed = _top_k(p, K)
      reference[c] = p - compressed
      expected_sum += compressed
      np.testing.assert_array_equal(decoded, compressed)
    output = server.next(state, sent)
    state = output.state
    np.testing.assert_allclose(output.result, expected_sum, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(residual, reference)
  # The absent client's residual waited: nonzero after three rounds, and each
  # participant's residual holds what top-k dropped (N - K coordinates).
  assert np.count_nonzero(residual[2]) == N - K


@pytest.mark.parametrize("name", ["easgd", "fedbuff", "scaffold"])
def test_algorithms_without_residuals_refuse_error_feedback(name):
  from fedsim.errors import UserError
  from tests.learning import builders
  stage = {"name": "encode", "encoder": "topk", "k": K, "error_feedback": True}
  with pytest.raises(UserError, match=r"aggregation\[0\]\.error_feedback: this algorithm"):
    builders.algorithm(name, {}, builders.task_model(), aggregation=[stage], num_clients=4)


def test_error_feedback_needs_the_encoder_alone_and_only_uploads():
  from fedsim.errors import UserError
  from fedsim.compression import upload_feedback
  from fedsim.aggregation import parse_aggregation
  chain = parse_aggregation([{"name": "clip", "norm": 1.0},
                             {"name": "encode", "encoder": "topk", "error_feedback": True}])
  with pytest.raises(UserError, match=r"aggregation\[1\]\.error_feedback: .*'clip'"):
    upload_feedback(chain)
  from fedsim.aggregation import check_chain   # what `fedsim validate` runs
  with pytest.raises(UserError, match=r"aggregation\[1\]\.error_feedback: .*'clip'"):
    check_chain(chain, "weighted_mean", "fedavg", 3)
  from fedsim.compression import parse_compression
  with pytest.raises(UserError, match=r"compression\.broadcast\.error_feedback"):
    parse_compression({"broadcast": {"encoder": "topk", "error_feedback": True}})
  with pytest.raises(UserError, match=r"error_feedback: expected true or false"):
    _spec(error_feedback="yes")


def test_weighted_mean_encodes_the_weighted_value_the_client_decoded():
  """TFF's MeanFactory encodes n_i * value; the client's residual is in update units."""
  import tensorflow as tf
  import tensorflow_federated as tff
  from fedsim.compression.feedback import weighted_feedback_step
  from fedsim.compression.mean import build_encoded_mean
  spec = _spec("topk", k=K)
  vec = tf.TensorSpec([N], tf.float32)
  step = tff.tensorflow.computation(
      lambda u, e, w: weighted_feedback_step(u, e, w, spec, SEED, weighted=True)[:2],
      vec, vec, tf.TensorSpec([], tf.float32))
  mean = build_encoded_mean(spec, weighted=True, seed=SEED).create(
      tff.TensorType(np.float32, [N]), tff.TensorType(np.float32))
  rng = np.random.default_rng(5)
  updates = rng.normal(size=(2, N)).astype(np.float32)
  residuals = rng.normal(scale=0.1, size=(2, N)).astype(np.float32)
  weights = np.float32([3.0, 5.0])
  outs = [step(u, e, w) for u, e, w in zip(updates, residuals, weights)]
  expected = np.zeros(N, np.float64)
  for (sent, residual), u, e, w in zip(outs, updates, residuals, weights):
    p = u + e
    np.testing.assert_array_equal(sent, p)
    kept = _top_k(p, K) != 0          # top-k of w * p keeps the same coordinates as of p
    np.testing.assert_array_equal(residual[~kept], p[~kept])
    np.testing.assert_allclose(residual[kept], 0.0, atol=1e-6)
    expected += w * _top_k(p, K)
  result = mean.next(mean.initialize(), [o[0] for o in outs], list(weights)).result
  np.testing.assert_allclose(result, expected / weights.sum(), rtol=1e-6, atol=1e-7)
