"""Building a run whose broadcast is encoded: fedsim's SimpleEncoder against tensor_encoding's.

    uv run python bench/broadcast_encoders.py                 # 3 processes each, 3 builds each
    uv run python bench/broadcast_encoders.py --processes 5 --builds 2

fedsim binds each broadcast tensor's encoder with its own `SimpleEncoder`
(fedsim/compression/tensor_encoding_api.py), which makes the encoder's ops where
the TFF computation calls them; tensor_encoding's class traces three
`tf.function`s per tensor when it is made, through AutoGraph, and again in each
computation that calls them. This bench builds one config (digits, an MLP,
4-bit Hadamard uploads and an 8-bit uniform broadcast) in fresh processes, the
two kinds alternating, `--builds` times each (other seeds: new builds, not the
cache's), and prints each build's CPU time: the first build of a process pays
AutoGraph's conversions once. Each process then trains two rounds, and the
final weights of the two kinds must be equal bit for bit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CONFIG = {
    "name": "bench", "rounds": 2, "clients_per_round": 4,
    "data": {"name": "digits", "num_clients": 20, "batch_size": 16},
    "model": {"name": "mlp", "hidden": [64, 32]},
    "algorithm": {"name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": 0.1}},
    "runtime": {"name": "inprocess", "device": "cpu"},
    "compression": {"aggregation": {"encoder": "hadamard", "bits": 4, "min_elements": 100},
                    "broadcast": {"encoder": "uniform", "bits": 8, "min_elements": 100}},
}


def child(kind: str, builds: int, weights_path: str) -> None:
  """Builds `builds` times with `kind`'s SimpleEncoder; prints the CPU seconds as JSON."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from unittest import mock
  import fedsim
  from fedsim.compression import tensor_encoding_api as te_api
  from fedsim.experiment import simulation
  from fedsim.experiment.config.loader import parse_config
  patch = (mock.patch.object(te_api, "simple_encoder", te_api.te.encoders.as_simple_encoder)
           if kind == "tensor_encoding" else contextlib.nullcontext())
  with patch:
    seconds = []
    for seed in range(builds):
      start = time.process_time()
      simulation.build_simulation(parse_config({**CONFIG, "seed": 100 + seed}))
      seconds.append(time.process_time() - start)
    with tempfile.TemporaryDirectory() as logdir:
      result = fedsim.run({**CONFIG, "seed": 0}, logdir=logdir, progress=False)
  np.savez(weights_path, *result.final_weights)
  print(json.dumps(seconds))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--processes", type=int, default=3, help="processes of each kind")
  parser.add_argument("--builds", type=int, default=3, help="builds in each process")
  parser.add_argument("--child", choices=["fedsim", "tensor_encoding"], help=argparse.SUPPRESS)
  parser.add_argument("--weights", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args.child, args.builds, args.weights)
    return
  kinds = ["fedsim", "tensor_encoding"]
  seconds = {kind: [] for kind in kinds}
  weights = {}
  with tempfile.TemporaryDirectory() as tmp:
    for i in range(args.processes):
      for kind in (kinds if i % 2 == 0 else kinds[::-1]):
        path = pathlib.Path(tmp) / f"{kind}-{i}.npz"
        out = subprocess.run([sys.executable, __file__, "--child", kind, "--builds",
                              str(args.builds), "--weights", str(path)],
                             capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
        seconds[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
        with np.load(path) as saved:
          weights.setdefault(kind, [saved[k] for k in sorted(saved.files, key=lambda k: int(
              k.split("_")[1]))])
  print(f"load average {os.getloadavg()[0]:.2f}; CPU seconds per build, median over"
        f" {args.processes} processes")
  print(f"{'SimpleEncoder':16s} {'first build':>12s} {'later builds':>13s}")
  for kind in kinds:
    first = statistics.median(s[0] for s in seconds[kind])
    later = statistics.median(x for s in seconds[kind] for x in s[1:]) if args.builds > 1 else 0
    print(f"{kind:16s} {first:12.2f} {later:13.2f}")
  equal = all(np.array_equal(a, b) for a, b in zip(weights["fedsim"], weights["tensor_encoding"],
                                                     strict=True))
  print(f"final weights after 2 rounds equal bit for bit: {equal}")
  if not equal:
    sys.exit(1)


if __name__ == "__main__":
  main()
