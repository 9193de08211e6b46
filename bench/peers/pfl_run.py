"""pfl-research on a workload, set up as its docs and benchmarks teach.

    PY=~/.cache/fedsim-peers/bin/python
    $PY bench/peers/pfl_run.py W2 --rounds 20                  # 1 process
    ~/.cache/fedsim-peers/bin/torchrun --nproc_per_node=2 bench/peers/pfl_run.py W2

`SimulatedBackend` over a `FederatedDataset` of every user's tensors (as its CIFAR-10
benchmark holds them), `FederatedAveraging` of a `PyTorchModel` with local and central
SGD, weighting by user. Rounds are timed by a callback after each central iteration
(rank 0 prints). No evaluation is asked for; pfl still evaluates each user of the
first central iteration before and after local training (iteration 0 is always an
evaluation iteration), so that happens in the warm-up round. pfl reports no training
loss without evaluation, so the loss check evaluates the final and the initial model
(rebuilt from the seed) on the first users' examples after the timed rounds.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByUser
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel
from torch import nn

import protocol
import shared_workloads as sw
import torch_models

EVAL_USERS = 10  # whose examples the loss check uses


class Classifier(nn.Module):
  """A network with the `loss` and `metrics` methods pfl's PyTorchModel calls."""

  def __init__(self, net: nn.Module):
    super().__init__()
    self.net = net

  def forward(self, x):
    return self.net(x)

  def loss(self, x, y, eval=False):  # noqa: A002  (pfl's keyword)
    self.eval() if eval else self.train()
    return F.cross_entropy(self(x), y)

  def metrics(self, x, y, eval=True):  # noqa: A002
    self.eval() if eval else self.train()
    with torch.no_grad():
      total = F.cross_entropy(self(x), y, reduction="sum").item()
    return {"loss": Weighted(total, len(y))}


class RoundClock(TrainingProcessCallback):
  """Prints each central iteration's end (rank 0 of a multi-process run)."""

  def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
    if os.environ.get("RANK", "0") == "0":
      protocol.emit(round=central_iteration + 1, t=time.time(), loss=None)
    return False, Metrics()


def build_model(w: sw.Workload) -> PyTorchModel:
  torch.manual_seed(sw.SEED)
  net = Classifier(torch_models.build(w.model))
  params = [p for p in net.parameters() if p.requires_grad]
  return PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                      central_optimizer=torch.optim.SGD(params, w.server_lr))


def mean_loss(model: PyTorchModel, data: Dataset) -> float:
  metrics = model.evaluate(data, eval_params=NNEvalHyperParams(local_batch_size=100))
  return float(dict((str(k), v) for k, v in metrics)["loss"].overall_value)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workload", choices=sorted(sw.WORKLOADS))
  parser.add_argument("--rounds", type=int, default=20)
  args = parser.parse_args()
  w = sw.WORKLOADS[args.workload]
  np.random.seed(sw.SEED)  # the user sampler draws from NumPy's global state

  users = {u: list(torch_models.to_torch(x, y))
           for u, (x, y) in enumerate(sw.all_users(w))}
  train = FederatedDataset.from_slices(users, get_user_sampler("random", list(users)))
  backend = SimulatedBackend(training_data=train, val_data=train,
                             postprocessors=[WeightByUser()])
  model = build_model(w)
  FederatedAveraging().run(
      algorithm_params=NNAlgorithmParams(
          central_num_iterations=args.rounds, evaluation_frequency=args.rounds + 1,
          train_cohort_size=w.cohort, val_cohort_size=0),
      backend=backend, model=model,
      model_train_params=NNTrainHyperParams(local_learning_rate=w.client_lr,
                                            local_num_epochs=w.local_epochs,
                                            local_batch_size=w.batch_size),
      model_eval_params=NNEvalHyperParams(local_batch_size=100),
      callbacks=[RoundClock()])

  if os.environ.get("RANK", "0") == "0":
    first = [users[u] for u in range(min(EVAL_USERS, w.users))]
    check = Dataset(raw_data=[torch.cat([x for x, _ in first]), torch.cat([y for _, y in first])])
    after = mean_loss(model, check)
    protocol.emit(loss_before=mean_loss(build_model(w), check), loss_after=after)


if __name__ == "__main__":
  main()
