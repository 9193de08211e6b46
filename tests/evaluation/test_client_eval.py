"""Per-client evaluation (`eval.federated`): numbers against NumPy, and the hold-out split."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from fedsim.config.typed import Component
from fedsim.data.federated import Examples, FederatedData, with_holdout
from fedsim.runtime.builtin import CompiledParams
from fedsim.runtime.runtime_registry import runtime_of
from fedsim.models import MODELS

DIM, CLASSES = 4, 3
SIZES = {"a": 5, "b": 3, "c": 7, "d": 1, "e": 0}


def _clients():
  rng = np.random.default_rng(7)
  return {cid: Examples(rng.normal(size=(n, DIM)).astype(np.float32),
                        rng.integers(0, CLASSES, n).astype(np.int32))
          for cid, n in SIZES.items()}


def _numpy_metrics(w, b, clients, ids):
  """Per-client accuracy of the linear model x @ w + b, then weighted / mean / percentiles."""
  correct, total = [], []
  for cid in ids:
    ex = clients[cid]
    if len(ex):
      correct.append(float(((ex.x @ w + b).argmax(1) == ex.y).sum()))
      total.append(len(ex))
  correct, total = np.array(correct), np.array(total)
  acc = correct / total
  return {"eval_clients/accuracy_weighted": correct.sum() / total.sum(),
          "eval_clients/accuracy_mean": acc.mean(),
          "eval_clients/accuracy_p10": np.percentile(acc, 10),
          "eval_clients/accuracy_p50": np.percentile(acc, 50),
          "eval_clients/accuracy_p90": np.percentile(acc, 90),
          "eval_clients/num_clients": len(acc)}


_INPROCESS = functools.partial(runtime_of("inprocess").function,
                               params=CompiledParams(device="cpu"))


# Batch size 2 splits clients over several batches; 256 is cut to the largest client's 8.
# A chunk of 1 byte evaluates one client per call (as `all` of a large population would
# be cut into chunks), each with its own batch size.
@pytest.mark.parametrize("runtime,batch_size,chunk_bytes", [
    (None, 2, None), (None, 256, None), (_INPROCESS, 2, None), (_INPROCESS, 256, None),
    (_INPROCESS, 256, 1)], ids=["local-2", "local-256", "inprocess-2", "inprocess-256",
                                "inprocess-256-per-client"])
def test_client_metrics_match_numpy_per_client_accuracy(tff_runtime, runtime, batch_size,
                                                        chunk_bytes, monkeypatch):
  import tensorflow_federated as tff
  from fedsim.experiment import client_eval
  from fedsim.experiment.client_eval import make_client_evaluator
  if chunk_bytes is not None:
    monkeypatch.setattr(client_eval, "CHUNK_BYTES", chunk_bytes)
  from fedsim.models.functional import build_task_model
  model = build_task_model(Component("logistic", MODELS.get("logistic").params()), (DIM,),
                           CLASSES, seed=0)
  rng = np.random.default_rng(3)
  w = rng.normal(size=(DIM, CLASSES)).astype(np.float32)
  b = rng.normal(size=CLASSES).astype(np.float32)
  weights = tff.learning.models.ModelWeights(trainable=(w, b), non_trainable=())
  clients = _clients()
  chosen = {1: ["a", "b", "d", "e"], 2: ["a", "b", "c", "d"]}
  evaluate = make_client_evaluator(model, clients, batch_size=batch_size, choose=chosen.get,
                                   as_function=runtime)
  for round_num, ids in chosen.items():
    got = evaluate(weights, round_num)
    want = _numpy_metrics(w, b, clients, ids)
    assert got.keys() == want.keys()
    for key, value in want.items():
      assert got[key] == pytest.approx(value, abs=1e-6), key
  # The clients differ, so the weighted and unweighted means differ: the test can tell them apart.
  assert want["eval_clients/accuracy_weighted"] != pytest.approx(
      want["eval_clients/accuracy_mean"])


def test_holdout_is_a_seeded_disjoint_share_of_each_client():
  clients = _clients()
  data = FederatedData(clients, test=clients["a"], input_shape=(DIM,), num_classes=CLASSES)
  split = with_holdout(data, 0.3, seed=5)
  again = with_holdout(data, 0.3, seed=5)
  other = with_holdout(data, 0.3, seed=6)
  for cid, ex in clients.items():
    n = len(ex)
    held, kept = split.client_test[cid], split.clients[cid]
    assert len(held) == min(round(0.3 * n), max(n - 1, 0))
    assert len(held) + len(kept) == n
    rows = sorted(map(tuple, np.concatenate([held.x, kept.x]).tolist()))
    assert rows == sorted(map(tuple, ex.x.tolist()))  # a partition of the client's examples
    np.testing.assert_array_equal(again.client_test[cid].x, held.x)
  assert any(not np.array_equal(other.client_test[c].x, split.client_test[c].x)
             for c in ("a", "c"))
  assert split.test is data.test
