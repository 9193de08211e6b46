"""The trained model, exported to `final_model.npz` once the last round is done."""

from __future__ import annotations

from fedsim.experiment.callbacks.callback import Callback
from fedsim.experiment.run_state import Run
from fedsim.state.model_export import export_model

FINAL_MODEL = "final_model.npz"


class FinalModel(Callback):

  def on_end(self, run: Run) -> None:
    export_model(run.run_dir / FINAL_MODEL, run.sim.algorithm.model_weights(run.state),
                 run.sim.model.weight_names)
