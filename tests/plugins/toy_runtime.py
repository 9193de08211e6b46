"""A runtime plugin, one file: the compiled round with one graph call per client.

Named in a config as `runtime: {name: one_by_one, device: cpu}` after
`plugins: [toy_runtime.py]`. It refuses algorithms whose clients keep state,
to show how a runtime says what it cannot run.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from fedsim.runtime.registry import Runtime, RuntimeParams, register_runtime

CALLS: list[int] = []  # clients per round this runtime ran, for the test to read


@dataclasses.dataclass(frozen=True)
class OneByOneParams(RuntimeParams):
  device: Literal["cpu", "gpu", "auto"] = "cpu"


class OneByOne(Runtime):
  """inprocess's compiled round, one client per graph call."""

  params = OneByOneParams

  def supports(self, algorithm, params) -> str | None:
    if algorithm.stateful_clients:
      return "one_by_one keeps no client states"
    return None

  def build(self, algorithm, params, context):
    from fedsim.runtime.inprocess import InProcessProcess
    compiled = InProcessProcess(algorithm.process, params.device, chunk_bytes=1)

    class Counted:
      def initialize(self):
        return compiled.initialize()

      def next(self, state, clients):
        CALLS.append(len(clients))
        return compiled.next(state, clients)

    return Counted()


register_runtime("one_by_one", OneByOne())
