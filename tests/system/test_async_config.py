"""Config keys that asynchronous rounds cannot honour are one-line errors, from
`fedsim validate` on (and a concurrency the loaded data cannot fill, at start-up)."""

from __future__ import annotations

import types

import pytest

import fedsim
from fedsim.errors import UserError
from fedsim.experiment.async_loop import BufferedRounds

FEDBUFF = {
    "name": "t", "rounds": 2, "clients_per_round": 3,
    "data": {"name": "digits", "num_clients": 8, "partition": "iid", "batch_size": 8},
    "model": {"name": "logistic"}, "algorithm": {"name": "fedbuff"},
}


@pytest.mark.parametrize("override,message", [
    ("backup_clients=1", "backup_clients: not used by asynchronous algorithms"),
    ("system.deadline_seconds=5", "system.deadline_seconds: not used by asynchronous"),
    ("system.min_clients=2", "system.min_clients: not used by asynchronous algorithms (every"
                             " server update aggregates clients_per_round = 3 buffered"
                             " updates); leave it at 1"),
    ("algorithm.concurrency=9", "algorithm.concurrency: 9 clients in flight, but"
                                " data.num_clients is 8"),
])
def test_validate_refuses_keys_asynchronous_rounds_cannot_honour(override, message):
  with pytest.raises(UserError) as e:
    fedsim.validate(FEDBUFF, [override])
  assert str(e.value).startswith(message)
  assert "\n" not in str(e.value)


def test_the_same_keys_are_fine_for_synchronous_rounds_and_at_their_defaults():
  fedsim.validate(FEDBUFF, ["system.min_clients=1", "algorithm.concurrency=8"])
  fedsim.validate(FEDBUFF, ["algorithm={name: fedavg}", "backup_clients=1",
                            "system.min_clients=2", "system.deadline_seconds=5"])


def test_a_variant_that_sets_min_clients_for_fedbuff_is_named():
  config = dict(FEDBUFF, algorithm={"name": "fedavg"}, system={"min_clients": 2},
                variants={"sync": {}, "async": {"algorithm": {"name": "fedbuff"}}})
  with pytest.raises(UserError, match="system.min_clients: not used by asynchronous"):
    fedsim.validate(config)
  config["variants"]["async"]["system"] = {"min_clients": 1}
  assert list(fedsim.validate(config)) == ["sync", "async"]


def _sim(concurrency=None):
  config = types.SimpleNamespace(clients_per_round=3, data=types.SimpleNamespace(name="digits"))
  return types.SimpleNamespace(
      config=config, algorithm=types.SimpleNamespace(concurrency=concurrency),
      data=types.SimpleNamespace(client_ids=tuple(f"c{i}" for i in range(8))))


def test_more_clients_in_flight_than_the_loaded_data_has_is_an_error_at_start_up():
  with pytest.raises(UserError, match="algorithm.concurrency: 9 clients in flight, but data"
                                      " 'digits' has 8 clients"):
    BufferedRounds(_sim(concurrency=9))


def test_concurrency_defaults_to_clients_per_round():
  assert BufferedRounds(_sim()).concurrency == 3
