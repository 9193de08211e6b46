"""A run's clients: the configured dataset, less what `eval.federated` holds
out, and the check that each round's sample fits in it. TensorFlow-free, so
`fedsim validate` makes the same check for datasets that build quickly."""

from __future__ import annotations

from fedsim.data import DATASETS
from fedsim.data.federated import FederatedData, with_holdout
from fedsim.errors import UserError
from fedsim.experiment.config.schema import ExperimentConfig


def training_data(config: ExperimentConfig) -> FederatedData:
  """The configured dataset, less the examples `eval.federated` holds out.

  Raises:
    UserError: naming the `data.` key whose value the dataset cannot meet
      (e.g. more clients than examples).
  """
  data = DATASETS.get(config.data.name).build(config.data.params, config.seed)
  if config.eval.federated and data.client_test is None:
    data = with_holdout(data, config.eval.holdout_fraction, config.seed)
  return data


def check_sample(config: ExperimentConfig, data: FederatedData) -> None:
  """Raises UserError, naming the key, if a round samples more clients than `data` has."""
  sampled = config.clients_per_round + config.backup_clients
  if sampled > len(data.client_ids):
    key = "clients_per_round" if not config.backup_clients else "backup_clients"
    raise UserError(f"{key}: {sampled} clients per round (clients_per_round +"
                    f" backup_clients) is more than the {len(data.client_ids)} clients of"
                    f" data '{config.data.name}'")
