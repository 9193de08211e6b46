"""Opens a session, runs a computation, records the worker's pid, then ends.

Usage: end_session.py MODE OUT_DIR, MODE one of normal, exception, wait.
"wait" sleeps inside the session so the test can signal this process.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from fedsim.backend import quiet
from fedsim.runtime import signals
from fedsim.runtime.session import session

tff = quiet.import_tff()


@tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
def total(values):
  return tff.federated_sum(values)


def main(mode: str, out_dir: str) -> None:
  signals.install_exit_handlers()
  with session(os.path.join(out_dir, "worker.log")) as worker:
    print(f"sum {total([1, 2, 3])}", flush=True)
    # Renamed into place so the test never reads a half-written file.
    with open(os.path.join(out_dir, "pid.tmp"), "w") as f:
      json.dump({"worker": worker.pid}, f)
    os.rename(os.path.join(out_dir, "pid.tmp"), os.path.join(out_dir, "pid.json"))
    if mode == "exception":
      raise ValueError("planned failure")
    if mode == "wait":
      time.sleep(120)
  print("done", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
