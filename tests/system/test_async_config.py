"""Config keys that asynchronous rounds cannot honour are one-line errors at start-up."""

from __future__ import annotations

import types

import pytest

from fedsim.errors import UserError
from fedsim.experiment.async_loop import BufferedRounds


def _sim(backup_clients=0, deadline_seconds=None, concurrency=None):
  config = types.SimpleNamespace(
      backup_clients=backup_clients, clients_per_round=3,
      system=types.SimpleNamespace(deadline_seconds=deadline_seconds),
      data=types.SimpleNamespace(name="digits"))
  return types.SimpleNamespace(
      config=config, algorithm=types.SimpleNamespace(concurrency=concurrency),
      data=types.SimpleNamespace(client_ids=tuple(f"c{i}" for i in range(8))))


@pytest.mark.parametrize("sim,message", [
    (_sim(backup_clients=1), "backup_clients: not used by asynchronous algorithms"),
    (_sim(deadline_seconds=5.0), "system.deadline_seconds: not used by asynchronous"),
    (_sim(concurrency=9), "algorithm.concurrency: 9 clients in flight, but data 'digits'"
                          " has 8 clients"),
])
def test_unusable_keys_are_one_line_errors(sim, message):
  with pytest.raises(UserError, match=message):
    BufferedRounds(sim)


def test_concurrency_defaults_to_clients_per_round():
  assert BufferedRounds(_sim()).concurrency == 3
