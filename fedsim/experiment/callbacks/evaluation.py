"""Evaluation of the global model every `eval.every` rounds and after the last.

It adds `eval/*` (and the clients' own evaluation, when configured) to the
round's metrics, so it runs before the callbacks that log them.
"""

from __future__ import annotations

from fedsim.experiment.callbacks.callback import Callback
from fedsim.experiment.round_result import RoundResult
from fedsim.experiment.run_state import Run


class Evaluation(Callback):

  def after_round(self, run: Run, record: RoundResult) -> None:
    sim, round_num = run.sim, run.round_num
    if round_num % sim.config.eval.every and round_num != sim.config.rounds:
      return
    weights = sim.algorithm.model_weights(run.state)
    record.metrics.update(sim.evaluate(weights))
    if sim.evaluate_clients is not None:
      record.metrics.update(sim.evaluate_clients(weights, round_num))
