"""Error feedback wraps client work from outside: it composes with client work
that keeps its own state (kept momentum) to the papers' rule, and no algorithm
module opts in to it."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from tests.learning import builders, reference
from tests.learning.test_fedavg import _run_stateful, _schedule

EF_TOPK = [{"name": "encode", "encoder": "topk", "fraction": 0.5, "min_elements": 1,
            "error_feedback": True}]


def _top_k(x, fraction):
  """The papers' top-k of one tensor: keep the ceil(fraction n) largest |x_i|."""
  flat = x.ravel()
  k = int(np.ceil(fraction * flat.size))
  out = np.zeros_like(flat)
  keep = np.argsort(-np.abs(flat))[:k]
  out[keep] = flat[keep]
  return out.reshape(x.shape)


def test_error_feedback_around_kept_momentum_matches_numpy(tff_runtime):
  """Each client keeps its momentum (the inner work's state) and its residual;
  the server averages, by examples, the top-k of delta + residual. Three
  classes: two-class logistic deltas come in +-pairs, ties top-k breaks its own way."""
  model = builders.task_model(num_classes=3)
  alg = builders.algorithm("fedavg", {
      "client_optimizer": {"name": "sgd", "learning_rate": 0.3, "momentum": 0.9},
      "client_optimizer_state": "keep"}, model, aggregation=EF_TOPK)
  schedule = _schedule()
  weights, stored = _run_stateful(alg, schedule)

  params = [np.array(v, np.float64) for v in model.initial_weights.trainable]
  optimizers, residuals = {}, {}
  for clients in schedule:
    sent, counts = [], []
    for idx, batches in clients:
      opt = optimizers.setdefault(idx, reference.Momentum(0.3, 0.9))
      trained = [p.copy() for p in params]
      for x, y in reference.real_batches(batches):
        trained = opt.apply(trained, reference.mean_grad(trained, x, y))
      e = residuals.get(idx, [np.zeros_like(p) for p in params])
      p = [w - t + r for w, t, r in zip(params, trained, e)]
      compressed = [_top_k(v, 0.5) for v in p]
      residuals[idx] = [v - c for v, c in zip(p, compressed)]
      sent.append(compressed)
      counts.append(batches["mask"].sum())
    params = [w - sum(n * s[j] for n, s in zip(counts, sent)) / sum(counts)
              for j, w in enumerate(params)]

  for got, want in zip(weights, params):
    np.testing.assert_allclose(got, want, atol=1e-5)
  for idx in (0, 1, 2):
    assert set(stored[idx]) == {"inner", "residual"}
    np.testing.assert_allclose(stored[idx]["inner"]["optimizer_state"]["accumulator"][0],
                               optimizers[idx].accum[0], atol=1e-5)
    for got, want in zip(stored[idx]["residual"], residuals[idx]):
      np.testing.assert_allclose(got, want, atol=1e-5)
  assert any(np.abs(r).max() > 1e-3 for rs in residuals.values() for r in rs)


@pytest.mark.parametrize("name,params,inner", [
    ("fedsgd", {}, None),
    ("fedavg", {}, None),
    ("fedavg", {"client_optimizer_state": "keep",
                "gradient_accumulation": {"steps": 2, "remainder": "carry"}},
     ["initialized", "optimizer_state", "window"])])
def test_client_state_holds_the_inner_state_and_the_residual(name, params, inner):
  model = builders.task_model()
  state = builders.algorithm(name, params, model, aggregation=EF_TOPK).initial_client_state
  assert list(state) == (["inner", "residual"] if inner else ["residual"])
  if inner:
    assert list(state["inner"]) == inner
  for r, w in zip(state["residual"], model.initial_weights.trainable, strict=True):
    assert r.shape == w.shape and not r.any()


def test_no_algorithm_module_mentions_error_feedback():
  import fedsim.algorithms
  folder = pathlib.Path(fedsim.algorithms.__file__).parent
  for path in folder.glob("*.py"):
    text = path.read_text().lower()
    for word in ("error_feedback", "error feedback", "residual"):
      assert word not in text, f"{path.name} mentions {word}"
