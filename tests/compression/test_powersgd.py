"""powersgd against a NumPy transcription of the paper's Algorithm 1 (Vogels,
Karimireddy & Jaggi 2019) with one aggregation step per client: two rounds of
the encoded mean, the second warm-started from the first's factor; full rank
sends the update exactly; its size in the compiled round from (n + m) r by
hand; error feedback keeps exactly what the server does not decode."""

from __future__ import annotations

import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from fedsim.compression import parse_direction
from tests.compression.test_paper_encoders import _round_trip


def _gram_schmidt(p: np.ndarray) -> np.ndarray:
  """The paper's ORTHOGONALIZE: classical Gram-Schmidt over p's columns (float64)."""
  out = np.zeros_like(p, dtype=np.float64)
  for j in range(p.shape[1]):
    column = p[:, j].astype(np.float64)
    column = column - out[:, :j] @ (out[:, :j].T @ column)
    out[:, j] = column / np.linalg.norm(column)
  return out


def _paper_round(clients: list[np.ndarray], q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(mean of the decoded updates, the next warm start) of one round of
  Algorithm 1 in which each worker runs both products on its own M_i:
  P_i = M_i Q, P^_i = ORTHOGONALIZE(P_i), Q_i = M_i^T P^_i, decoded P^_i Q_i^T;
  the next Q is the mean of the Q_i (the paper's all-reduce)."""
  decoded, factors = [], []
  for m in clients:
    matrix = m.reshape(-1, m.shape[-1]).astype(np.float64)
    p_hat = _gram_schmidt(matrix @ q)
    q_new = matrix.T @ p_hat
    decoded.append((p_hat @ q_new.T).reshape(m.shape))
    factors.append(q_new)
  return np.mean(decoded, axis=0), np.mean(factors, axis=0)


def _mean_process(shape, config, seed=0):
  import tensorflow_federated as tff
  from fedsim.compression.mean import build_encoded_mean
  direction = parse_direction({"encoder": "powersgd", "min_elements": 1, **config}, "c.a")
  return build_encoded_mean(direction, weighted=False, seed=seed).create(
      tff.TensorType(np.float32, shape))


def _warm_start(state) -> np.ndarray:
  """The server's factor Q in the encoded mean's state."""
  return np.asarray(state[0]["encoders"][0][0])   # (sum state, count state)


def _clients(shape, count, seed):
  rng = np.random.default_rng(seed)
  # Updates with a common dominant direction, as gradients of one model share.
  common = rng.normal(size=shape).astype(np.float32)
  return [(common + 0.3 * rng.normal(size=shape)).astype(np.float32) for _ in range(count)]


@pytest.mark.parametrize("shape, rank", [((12, 7), 2), ((3, 3, 2, 4), 1)])
def test_two_warm_started_rounds_equal_the_papers_algorithm(tff_runtime, shape, rank):
  process = _mean_process(shape, {"rank": rank})
  state = process.initialize()
  q = _warm_start(state).astype(np.float64)
  m = shape[-1]
  assert q.shape == (m, rank)
  rounds = [_clients(shape, 3, seed) for seed in (1, 2)]
  factors = [q]
  for clients in rounds:
    output = process.next(state, clients)
    want, q = _paper_round(clients, q)
    np.testing.assert_allclose(output.result, want, rtol=1e-5, atol=1e-5)
    state = output.state
    factors.append(q)
  # The server keeps the paper's Q up to a positive scale (it leaves every
  # decoded value unchanged): the sum of the Q_i at unit Frobenius norm.
  np.testing.assert_allclose(_warm_start(state), q / np.linalg.norm(q), rtol=1e-5, atol=1e-6)
  # The second round did start from the first's factor: from the first Q it differs.
  warm, cold = (_paper_round(rounds[1], f)[0] for f in (factors[1], factors[0]))
  assert np.abs(warm - cold).max() > 1e-2


def test_the_first_factor_is_seeded_by_the_run_seed(tff_runtime):
  first = _warm_start(_mean_process((12, 7), {"rank": 2}, seed=0).initialize())
  again = _warm_start(_mean_process((12, 7), {"rank": 2}, seed=0).initialize())
  other = _warm_start(_mean_process((12, 7), {"rank": 2}, seed=1).initialize())
  assert first.tobytes() == again.tobytes() and first.tobytes() != other.tobytes()
  assert 0.3 < first.std() < 3   # N(0, 1) draws


@pytest.mark.parametrize("shape", [(6, 5), (5, 6), (2, 3, 4), (3, 3, 2, 4)])
@pytest.mark.parametrize("warm_start", [True, False])
def test_full_rank_reproduces_the_update(shape, warm_start):
  values = np.random.default_rng(3).normal(size=shape).astype(np.float32)
  full = min(int(np.prod(shape[:-1])), shape[-1])
  for rank in (full, full + 5):   # a larger rank is capped at min(n, m)
    decoded, encoded = _round_trip(values, {"encoder": "powersgd", "rank": rank,
                                            "warm_start": warm_start})
    np.testing.assert_allclose(decoded, values, rtol=0, atol=1e-5)
    assert encoded["p"].shape == (values.size // shape[-1], full)
    assert encoded["q"].shape == (shape[-1], full)


def test_full_rank_mean_of_clients_is_the_uncompressed_mean(tff_runtime):
  process = _mean_process((8, 5), {"rank": 5})
  state = process.initialize()
  for seed in (4, 5):
    clients = _clients((8, 5), 3, seed)
    output = process.next(state, clients)
    np.testing.assert_allclose(output.result, np.mean(clients, axis=0), rtol=0, atol=1e-5)
    state = output.state


def test_low_rank_without_warm_start_is_a_projection_of_each_update():
  values = np.random.default_rng(6).normal(size=[20, 9]).astype(np.float32)
  decoded, encoded = _round_trip(values, {"encoder": "powersgd", "rank": 2,
                                          "warm_start": False})
  p = encoded["p"].astype(np.float64)
  np.testing.assert_allclose(p.T @ p, np.eye(2), atol=1e-5)
  np.testing.assert_allclose(decoded, p @ p.T @ values, rtol=0, atol=1e-5)
  assert np.linalg.matrix_rank(decoded, tol=1e-4) == 2


@pytest.mark.parametrize("shape", [(7,), ()])
def test_vectors_and_scalars_are_sent_unchanged(shape):
  values = np.asarray(np.random.default_rng(8).normal(size=shape), np.float32)
  decoded, encoded = _round_trip(values, {"encoder": "powersgd", "rank": 2})
  assert decoded.tobytes() == values.tobytes()
  assert list(encoded) == ["values"]


@pytest.mark.parametrize("warm_start", [True, False])
@pytest.mark.parametrize("error_feedback", [False, True])
def test_fedavg_sizes_powersgd_to_its_two_factors(warm_start, error_feedback):
  from fedsim.sizing.mapreduce_form import client_wire_bits
  from tests.learning import builders
  model = builders.task_model("mlp", (64,), 10, hidden=[200])   # kernels 64x200, 200x10
  rank = 3
  stage = {"name": "encode", "encoder": "powersgd", "rank": rank, "warm_start": warm_start,
           "min_elements": 2000, "error_feedback": error_feedback}
  algorithm = builders.algorithm("fedavg", {}, model, batch_size=4, aggregation=[stage])
  wire = client_wire_bits(algorithm.sizing_process or algorithm.process,
                          algorithm.upload_extras_types)
  # Per kernel n x m: P^ (n x r) and Q' (m x r) as float32; the biases (200 + 10)
  # as float32. Q' is sent once, though it also updates the server's factor.
  kernels = [(64, 200), (200, 10)]
  factor_bits = sum(m * rank * 32 for _, m in kernels) if warm_start else 0
  # Error feedback's clients keep a copy of the server's Q (down with the
  # model) and send their Q' to update it (up): once more each way.
  copies = 1 + error_feedback
  assert wire.aggregate_model == (sum(n * rank * 32 for n, _ in kernels) + 210 * 32
                                  + sum(m * rank * 32 for _, m in kernels)
                                  + error_feedback * factor_bits)
  # Down: the float32 model and, with warm start, each kernel's Q (m x r).
  parameters = 64 * 200 + 200 + 200 * 10 + 10
  assert wire.broadcast_model == parameters * 32 + copies * factor_bits


def test_fedsim_list_shows_powersgd_with_its_parameters(capsys):
  from fedsim import cli
  assert cli.main(["list", "encoder"]) == 0
  lines = capsys.readouterr().out.splitlines()
  squeezed = [" ".join(line.split()) for line in lines]
  at = squeezed.index("encoder powersgd rank: int = 1, warm_start: bool = true")
  assert lines[at + 1].strip().startswith("PowerSGD (Vogels et al. 2019), per client")


def test_rank_is_bounded():
  from fedsim.errors import UserError
  with pytest.raises(UserError, match=r"c\.a\.rank: must be >= 1"):
    parse_direction({"encoder": "powersgd", "rank": 0}, "c.a")


def test_error_feedback_with_warm_start_follows_the_papers_rule(tff_runtime):
  """FedAvg (client SGD) whose clients send PowerSGD(delta + residual) and keep
  the rest, three rounds: the server averages, by examples, P^ Q'^T of each
  client; the next Q is the examples-weighted sum of the Q' (up to scale,
  which leaves decoding unchanged); the bias goes unchanged (residual 0)."""
  import tensorflow as tf
  from fedsim.compression.feedback import initial_encoder_states
  from tests.learning import builders, reference
  from tests.learning.test_fedavg import _run_stateful, _schedule
  stage = {"name": "encode", "encoder": "powersgd", "rank": 1, "min_elements": 1,
           "error_feedback": True}
  model = builders.task_model(num_classes=3)   # a 3 x 3 kernel and 3 biases
  alg = builders.algorithm("fedavg", {"client_optimizer": {"name": "sgd",
                                                           "learning_rate": 0.3}},
                           model, aggregation=[stage])
  schedule = _schedule()
  weights, stored = _run_stateful(alg, schedule)

  specs = [tf.TensorSpec(w.shape, tf.float32) for w in model.initial_weights.trainable]
  q = initial_encoder_states(specs, parse_direction({k: v for k, v in stage.items()
                                                     if k != "name"}, "a"), 0)[0][0]
  q = np.asarray(q, np.float64)
  params = [np.array(v, np.float64) for v in model.initial_weights.trainable]
  residuals = {}
  for clients in schedule:
    sent, counts, factors = [], [], []
    for idx, batches in clients:
      trained = [p.copy() for p in params]
      for x, y in reference.real_batches(batches):
        trained = [p - 0.3 * g for p, g in zip(trained, reference.mean_grad(trained, x, y))]
      e = residuals.get(idx, [np.zeros_like(p) for p in params])
      kernel, bias = (w - t + r for w, t, r in zip(params, trained, e))
      p_hat = _gram_schmidt(kernel @ q)
      q_new = kernel.T @ p_hat
      compressed = [p_hat @ q_new.T, bias]
      residuals[idx] = [kernel - compressed[0], np.zeros_like(bias)]
      n = batches["mask"].sum()
      sent.append(compressed)
      counts.append(n)
      factors.append(n * q_new)
    params = [w - sum(n * s[j] for n, s in zip(counts, sent)) / sum(counts)
              for j, w in enumerate(params)]
    q = np.sum(factors, axis=0)

  for got, want in zip(weights, params):
    np.testing.assert_allclose(got, want, atol=1e-5)
  for idx in (0, 1, 2):
    for got, want in zip(stored[idx]["residual"], residuals[idx]):
      np.testing.assert_allclose(got, want, atol=1e-5)
  assert max(np.abs(r[0]).max() for r in residuals.values()) > 1e-3


@pytest.mark.slow
def test_a_config_broadcasts_full_rank_and_uploads_rank_2_with_error_feedback(
    tff_runtime, tmp_path):
  import fedsim
  config = {
      "name": "powersgd", "seed": 1, "rounds": 2, "clients_per_round": 2,
      "data": {"name": "digits", "num_clients": 4, "partition": "iid", "batch_size": 16},
      "model": {"name": "logistic"},   # a 64 x 10 kernel and 10 biases
      "algorithm": {"name": "fedavg"},
      "broadcast": [{"name": "encode", "encoder": "powersgd", "rank": 10,
                     "min_elements": 1}],
      "aggregation": [{"name": "encode", "encoder": "powersgd", "rank": 2,
                       "min_elements": 1, "error_feedback": True}],
  }
  rows = fedsim.run(config, logdir=tmp_path).metrics
  assert len(rows) == 2
  for row in rows:
    # Down: P^ (64 x 10) and Q' (10 x 10) for the kernel, the biases, the
    # warm-start Q of the upload's kernel twice (the encoder's and error
    # feedback's copy), and of the broadcast's none (its server keeps it).
    assert row["broadcast_model_bits_per_client"] == (74 * 10 + 10 + 2 * 10 * 2) * 32
    # Up: P^ (64 x 2), Q' (10 x 2), the biases, and Q' again for the copy.
    assert row["aggregate_model_bits_per_client"] == (74 * 2 + 10 + 10 * 2) * 32
    assert row["error_feedback/residual_norm"] > 0
    assert math.isfinite(row["train/loss"])


def test_a_round_of_zero_updates_keeps_the_last_factor():
  import tensorflow as tf
  from fedsim.compression.stages.low_rank import PowerSgdStage
  stage = PowerSgdStage(2, True, (5, 4), salt=np.int32([1, 2]))
  state = stage.initial_state()
  kept = stage.update_state(state, {"warm_start": tf.zeros([4, 2])})["warm_start"]
  np.testing.assert_array_equal(kept, state["warm_start"])
  summed = tf.constant(np.arange(8, dtype=np.float32).reshape(4, 2))
  scaled = stage.update_state(state, {"warm_start": summed})["warm_start"].numpy()
  np.testing.assert_allclose(scaled, summed.numpy() / np.linalg.norm(summed.numpy()), rtol=1e-6)
