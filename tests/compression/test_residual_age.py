"""Error feedback's residual ages: rounds since each aggregated client's residual was
last updated, from the rounds the client-state store saved, on a participation
sequence known by hand."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from fedsim.compression.feedback import residual_ages
from fedsim.state.client_states import ClientStateStore


def _state(value):
  return collections.OrderedDict(initialized=np.float32(1.0),
                                 residual=(np.full(3, value, np.float32),))


@pytest.fixture
def store(tmp_path):
  return ClientStateStore(tmp_path / "client_states", _state(0.0))


def _save(store, clients, state, round_num):
  """What the run loop does: the ages of the states a round replaces, then the save."""
  ages = residual_ages(_state(0.0), store.last_updated(clients), round_num)
  store.save(clients, [state] * len(clients), round_num)
  return ages


def test_ages_follow_the_participation(store, tmp_path):
  sequence = [(1, "ab"), (2, "bc"), (3, "ac"), (5, "abc"), (6, "b")]
  want = [{},
          {"error_feedback/residual_age_mean": 1.0, "error_feedback/residual_age_max": 1.0},
          {"error_feedback/residual_age_mean": 1.5, "error_feedback/residual_age_max": 2.0},
          {"error_feedback/residual_age_mean": 7 / 3, "error_feedback/residual_age_max": 3.0},
          {"error_feedback/residual_age_mean": 1.0, "error_feedback/residual_age_max": 1.0}]
  for (round_num, clients), expected in zip(sequence, want):
    got = _save(store, list(clients), _state(round_num), round_num)
    assert got == pytest.approx(expected) and got.keys() == expected.keys()
  assert store.last_updated(["a", "b", "c", "d"]) == [5, 6, 5, None]
  # The age lives in the files: a store reopened on them (a resumed run) sees it.
  store.flush()
  reopened = ClientStateStore(tmp_path / "client_states", _state(0.0))
  assert _save(reopened, ["a"], _state(9.0), 9) == {
      "error_feedback/residual_age_mean": 4.0, "error_feedback/residual_age_max": 4.0}
  (loaded,) = reopened.load(["a"])
  np.testing.assert_array_equal(loaded["residual"][0], np.full(3, 9.0, np.float32))


def test_states_without_a_residual_or_a_round_report_no_age(tmp_path):
  plain = collections.OrderedDict(w=np.zeros(2))
  assert residual_ages(plain, [1, 1], 2) == {}
  residual = ClientStateStore(tmp_path / "residual", _state(0.0))
  residual.save(["a"], [_state(1.0)])
  assert residual.last_updated(["a"]) == [None]
  assert residual_ages(_state(0.0), residual.last_updated(["a"]), 2) == {}
