"""`runtime.precision: bfloat16`: bfloat16 compute from float32 weights."""

from __future__ import annotations

import numpy as np
import pytest

import fedsim
from fedsim.errors import UserError
from fedsim.experiment.config.loader import load_config

QUICKSTART = "experiments/quickstart.yaml"


@pytest.fixture(scope="module")
def quickstart_runs(tff_runtime, tmp_path_factory):
  """The README's quickstart (50 rounds) on inprocess in both precisions."""
  logdir = tmp_path_factory.mktemp("precision")
  return {p: fedsim.run(QUICKSTART, ["runtime.name=inprocess", f"runtime.precision={p}"],
                        logdir=logdir, progress=False)
          for p in ("float32", "bfloat16")}


def test_bfloat16_quickstart_within_one_point_of_float32(quickstart_runs):
  full, half = (quickstart_runs[p].metrics for p in ("float32", "bfloat16"))
  assert abs(full[-1]["eval/accuracy"] - half[-1]["eval/accuracy"]) <= 0.01
  # bfloat16 really ran: its 8-bit mantissa moves the trained weights by far
  # more than float32 rounding of the same steps would (~1e-6).
  drift = max(float(np.max(np.abs(a - b))) for a, b in zip(
      quickstart_runs["float32"].final_weights, quickstart_runs["bfloat16"].final_weights))
  assert drift > 1e-3


def test_bfloat16_keeps_float32_weights_and_sizes(quickstart_runs):
  full, half = quickstart_runs["float32"], quickstart_runs["bfloat16"]
  assert all(w.dtype == np.float32 for w in half.final_weights)
  assert [r["aggregate_bits"] for r in half.metrics] == [r["aggregate_bits"] for r in full.metrics]
  assert [r["broadcast_bits"] for r in half.metrics] == [r["broadcast_bits"] for r in full.metrics]


def test_precision_is_refused_on_the_local_runtime():
  # TFF's worker computes in the model's own dtype: `local` declares no such key.
  with pytest.raises(UserError, match=r"^runtime\.precision: unknown key"):
    load_config(QUICKSTART, ["runtime=local", "runtime.precision=bfloat16"])
