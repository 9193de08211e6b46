"""A runtime plugin, one file: the compiled round with one graph call per client.

Named in a config as `runtime: {name: one_by_one, device: cpu}` once this file
is in its `plugins:`. It refuses algorithms whose clients keep state, to show
how a runtime says what it cannot run (`local` runs those, with a one-line
notice).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from fedsim.runtime.contract import RoundProcess
from fedsim.runtime.runtime_registry import Runtime, RuntimeParams, register_runtime

CALLS: list[int] = []  # clients of each round this runtime ran, for its test to read


@dataclasses.dataclass(frozen=True)
class OneByOneParams(RuntimeParams):
  device: Literal["cpu", "gpu", "auto"] = "cpu"


class OneByOneRound(RoundProcess):
  """inprocess's compiled round cut into one chunk per client."""

  def __init__(self, compiled):
    self._compiled = compiled

  @property
  def stateful_clients(self) -> bool:
    return self._compiled.stateful_clients

  @property
  def client_outputs(self) -> bool:  # a buffered algorithm's dispatch returns each result
    return self._compiled.client_outputs

  @property
  def phases(self):  # start, run_clients, merge, finish: rounds of mixed encoder values run
    return self._compiled.phases

  def initialize(self):
    return self._compiled.initialize()

  def next(self, state, clients, client_states=None):
    CALLS.append(len(clients))
    return self._compiled.next(state, clients, client_states)


class OneByOne(Runtime):
  params = OneByOneParams

  def supports(self, algorithm, params) -> str | None:
    if algorithm.stateful_clients:
      return "one_by_one keeps no client states"
    return None

  def build(self, algorithm, params, context) -> RoundProcess:
    from fedsim.runtime.inprocess import InProcessProcess  # TensorFlow: only when a run builds
    return OneByOneRound(InProcessProcess(algorithm.process, params.device, chunk_bytes=1))


register_runtime("one_by_one", OneByOne())
