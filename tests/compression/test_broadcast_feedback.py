"""Error feedback on the broadcast (server-side residual): the server encodes
w_t + e_t, every client decodes C(w_t + e_t), and e_{t+1} = w_t + e_t - C(w_t + e_t)
(Seide et al. 2014; Karimireddy et al. 2019), checked against NumPy over three
rounds; a run with it resumes bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import fedsim
from fedsim.compression import parse_direction

N, K, SEED = 50, 5, 2


def _top_k(x, k):
  """The papers' top-k: keep the k largest |x_i|, zero the rest."""
  out = np.zeros_like(x)
  keep = np.argsort(-np.abs(x))[:k]
  out[keep] = x[keep]
  return out


def test_server_residual_follows_numpy_over_three_rounds(tff_runtime):
  del tff_runtime
  import tensorflow_federated as tff
  from fedsim.compression.broadcast import build_encoded_broadcast
  spec = parse_direction({"encoder": "topk", "k": K, "min_elements": 10,
                          "error_feedback": True}, "broadcast[0]")
  value_type = tff.to_type([(np.float32, [N]), (np.float32, [3])])   # the second: unencoded
  process = build_encoded_broadcast(value_type, spec, seed=SEED)

  @tff.federated_computation(process.initialize.type_signature.result,
                             tff.FederatedType(value_type, tff.SERVER),
                             tff.FederatedType(np.float32, tff.CLIENTS))
  def deliver(state, value, client_marker):
    out = process.next(state, value)
    return out.state, tff.federated_zip((out.result, client_marker)), out.measurements

  rng = np.random.default_rng(0)
  state, residual = process.initialize(), np.zeros(N, np.float32)
  for _ in range(3):
    value = [rng.normal(size=N).astype(np.float32), rng.normal(size=3).astype(np.float32)]
    state, received, measurements = deliver(state, value, [0.0, 1.0])
    x = value[0] + residual
    sent = _top_k(x, K)
    residual = x - sent
    for client_value, _ in received:   # both clients decode the same C(w + e)
      np.testing.assert_array_equal(client_value[0], sent)
      np.testing.assert_array_equal(client_value[1], value[1])
    np.testing.assert_array_equal(state["residual"][0], residual)
    np.testing.assert_array_equal(state["residual"][1], np.zeros(3, np.float32))
    assert measurements["error_feedback"]["residual_norm"] == pytest.approx(
        np.linalg.norm(residual), rel=1e-6)
    assert np.count_nonzero(residual) == N - K


CONFIG = {
    "name": "broadcast_ef", "seed": 4, "rounds": 4, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 6, "batch_size": 16},
    "model": {"name": "logistic"}, "algorithm": {"name": "fedavg"},
    "broadcast": [{"name": "encode", "encoder": "topk", "k": 20, "min_elements": 100,
                   "error_feedback": True}],
    "runtime": {"name": "inprocess"}, "checkpoint": {"every": 2},
}


@pytest.mark.slow
def test_a_run_with_broadcast_feedback_resumes_bit_for_bit(tff_runtime, tmp_path):
  del tff_runtime
  whole = fedsim.run(CONFIG, logdir=tmp_path / "whole", progress=False)
  half = fedsim.run(CONFIG, ["rounds=2"], logdir=tmp_path / "parts", progress=False)
  resumed = fedsim.run(CONFIG, logdir=tmp_path / "parts", progress=False, resume=half.run_dir)

  def rows(result):
    return [{k: v for k, v in r.items() if k != "round_seconds"} for r in result.metrics]

  assert all(r["distributor/error_feedback/residual_norm"] > 0 for r in rows(whole))
  assert rows(resumed) == rows(whole)
  for got, want in zip(resumed.final_weights, whole.final_weights):
    np.testing.assert_array_equal(got, want)
  plain = dict(CONFIG, broadcast=[dict(CONFIG["broadcast"][0], error_feedback=False)])
  other = fedsim.run(plain, logdir=tmp_path / "plain", progress=False)
  assert not np.array_equal(other.final_weights[0], whole.final_weights[0])
