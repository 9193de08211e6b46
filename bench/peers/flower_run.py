"""Flower on a workload, set up as its docs teach: `run_simulation` on Ray actors.

    ~/.cache/fedsim-peers/bin/python bench/peers/flower_run.py W2 --rounds 20 --cpus 1

A `NumPyClient` per user (built by the ClientApp's `client_fn` from the node's
partition id, training one epoch of PyTorch SGD on its own DataLoader), the
ServerApp's `FedAvg` (start model passed as `initial_parameters`, no federated
evaluation: `fraction_evaluate=0`), `--cpus` CPUs per client actor. Rounds are timed
when FedAvg has aggregated a round's updates; the loss is the clients' mean
training loss, aggregated by `fit_metrics_aggregation_fn`.
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict

import torch
import torch.nn.functional as F
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.simulation import run_simulation
from torch.utils.data import DataLoader, TensorDataset

import protocol
import shared_workloads as sw
import torch_models


def get_weights(net):
  return [v.cpu().numpy() for v in net.state_dict().values()]


def set_weights(net, weights):
  keys = net.state_dict().keys()
  net.load_state_dict(OrderedDict((k, torch.from_numpy(v)) for k, v in zip(keys, weights)))


class Client(NumPyClient):
  def __init__(self, w: sw.Workload, user: int):
    self.w = w
    self.net = torch_models.build(w.model)
    x, y = torch_models.to_torch(*sw.user_data(w, user))
    self.loader = DataLoader(TensorDataset(x, y), batch_size=w.batch_size, shuffle=True)

  def fit(self, parameters, config):
    set_weights(self.net, parameters)
    self.net.train()
    opt = torch.optim.SGD(self.net.parameters(), lr=self.w.client_lr)
    total, seen = 0.0, 0
    for _ in range(self.w.local_epochs):
      for x, y in self.loader:
        opt.zero_grad()
        loss = F.cross_entropy(self.net(x), y)
        loss.backward()
        opt.step()
        total += loss.item() * len(y)
        seen += len(y)
    return get_weights(self.net), seen, {"loss": total / seen}


def weighted_loss(results):
  n = sum(count for count, _ in results)
  return {"loss": sum(count * m["loss"] for count, m in results) / n}


class TimedFedAvg(FedAvg):
  """FedAvg that prints when a round's updates are aggregated (its last step here)."""

  def aggregate_fit(self, server_round, results, failures):
    parameters, metrics = super().aggregate_fit(server_round, results, failures)
    protocol.emit(round=server_round, t=time.time(), loss=metrics.get("loss"),
                  failures=len(failures))
    return parameters, metrics


def apps(w: sw.Workload, rounds: int) -> tuple[ServerApp, ClientApp]:
  def client_fn(context: Context):
    return Client(w, int(context.node_config["partition-id"])).to_client()

  def server_fn(context: Context):
    torch.manual_seed(sw.SEED)
    strategy = TimedFedAvg(
        fraction_fit=w.cohort / w.users, min_fit_clients=w.cohort,
        min_available_clients=w.users, fraction_evaluate=0.0, min_evaluate_clients=0,
        initial_parameters=ndarrays_to_parameters(get_weights(torch_models.build(w.model))),
        fit_metrics_aggregation_fn=weighted_loss)
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

  return ServerApp(server_fn=server_fn), ClientApp(client_fn=client_fn)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workload", choices=sorted(sw.WORKLOADS))
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--cpus", type=int, default=2, help="CPUs per client actor")
  args = parser.parse_args()
  w = sw.WORKLOADS[args.workload]
  server_app, client_app = apps(w, args.rounds)
  run_simulation(server_app=server_app, client_app=client_app, num_supernodes=w.users,
                 backend_config={"client_resources": {"num_cpus": args.cpus,
                                                      "num_gpus": 0.0}})


if __name__ == "__main__":
  main()
