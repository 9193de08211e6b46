"""Issue 33's plugin encoder trains as fedsim's own `hadamard` on every runtime.

`hadamard_nearest` (experiments/plugin_example/lab_plugin.py) chains TFF's
stages: flatten, `HadamardEncodingStage`, 4-bit round-to-nearest
`UniformQuantizationEncodingStage`, bit packing. Before fedsim drew the
rotation's seed itself, `inprocess` (the default runtime's choice) decoded
with a seed the clients never used and trained digits to chance (0.1056),
while `local` reached 0.8944. Each case runs both encoders as variants of one
config; fedsim's `hadamard` at 4 bits with deterministic rounding is the
reference (its signs differ per client, the chain's per round, so the two
are not equal, only as accurate). `inprocess`, where the bug was, runs by
default; `local` and `ray` (on the module's two-node cluster of
tests/runtime/test_cluster.py) are `-m long` (test_tff_stages.py checks the
means of every runtime equal TFF's on every round, for every stage kind).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import fedsim

PLUGIN = pathlib.Path(__file__).resolve().parents[2] / "experiments/plugin_example/lab_plugin.py"
ENCODED = {"bits": 4, "min_elements": 1000}
CONFIG = {
    "name": "chain", "seed": 0, "rounds": 10, "clients_per_round": 10,
    "plugins": [str(PLUGIN)],
    "data": {"name": "digits", "num_clients": 40, "partition": "dirichlet", "alpha": 0.5,
             "batch_size": 16},
    "model": {"name": "mlp", "hidden": [256]},
    "algorithm": {"name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": 0.3}},
    "variants": {
        "chain": {"compression": {"aggregation": {"encoder": "hadamard_nearest", **ENCODED}}},
        "builtin": {"compression": {"aggregation": {"encoder": "hadamard",
                                                    "rounding": "deterministic", **ENCODED}}},
    },
}


def _runtime(name: str, request) -> dict:
  if name != "ray":
    return {"name": name}
  address, _ = request.getfixturevalue("ray_cluster")
  return {"name": "ray", "address": address, "workers": 2, "device": "cpu"}


@pytest.mark.slow
@pytest.mark.timeout(1800)   # two variants of 10 rounds: ~10 min on ray on two loaded cores
@pytest.mark.parametrize("runtime", [
    "inprocess", pytest.param("local", marks=pytest.mark.long),
    pytest.param("ray", marks=pytest.mark.long)])
def test_the_te_stages_chain_trains_as_fedsims_hadamard(runtime, request, tmp_path):
  results = fedsim.run({**CONFIG, "runtime": _runtime(runtime, request)}, logdir=tmp_path,
                       progress=False)
  chain, builtin = (results[v].final["eval/accuracy"] for v in ("chain", "builtin"))
  assert builtin > 0.8
  assert abs(chain - builtin) <= 0.01, (chain, builtin)
  # The same bits: the chain's per-round seed goes down with the parameters,
  # the built-in's per-client seed comes up with each update.
  assert results["chain"].size_info.per_client.aggregate < (
      results["builtin"].size_info.per_client.aggregate)
