"""The `gradient_accumulation` section shared by algorithms that train locally.

Horovod's local gradient aggregation sums the gradients of
`backward_passes_per_step` batches and applies them in one optimizer step.
Where fedsim and Horovod differ, both are options, fedsim's default first:

  divide_by   window (the passes in the window: the mean of its batch means)
              | backward_passes (the constant `steps`, Horovod's
              `average_aggregated_gradients=True`) | examples (the examples, or
              tokens, the window covers: the mean over all of them, so k short
              batches equal one batch of their union) | none (the sum, Horovod's
              default `average_aggregated_gradients=False`)
  remainder   flush (a partial last window is applied at the end of local
              training) | carry (it is kept, as Horovod's accumulator variables
              keep it, and completed in the client's next round: client state)
  iterations  applies (the optimizer counts one iteration per applied window)
              | backward_passes (every pass counts, as Horovod increments
              `optimizer.iterations`; this changes Adam's bias correction)
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from fedsim.config.typed import bounded


@dataclasses.dataclass(frozen=True)
class GradientAccumulation:
  steps: int = bounded(1, min=1)   # backward passes per optimizer step
  divide_by: Literal["window", "backward_passes", "examples", "none"] = "window"
  remainder: Literal["flush", "carry"] = "flush"
  iterations: Literal["applies", "backward_passes"] = "applies"

  def for_training(self):
    """The `local_training.Accumulation` these options describe."""
    from fedsim.learning.local_training import Accumulation
    return Accumulation(steps=self.steps, divide_by=self.divide_by,
                        carry=self.remainder == "carry",
                        count_passes=self.iterations == "backward_passes")


def accumulation_field():
  return dataclasses.field(default_factory=GradientAccumulation)
