"""Client states in memory up to a byte budget, spilled to disk past it, flushed for checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.state.client_states import ClientStateStore

STATE_BYTES = 4 * 4  # one float32 tensor of 4 elements


def _state(value: float):
  return (np.full(4, value, np.float32),)


def _files(store) -> list[str]:
  return sorted(p.name for p in store.directory.glob("*.npz"))


def test_within_the_budget_nothing_is_written_until_a_flush(tmp_path):
  store = ClientStateStore(tmp_path / "s", _state(0.0), memory_bytes=3 * STATE_BYTES)
  store.save(["a", "b", "c"], [_state(1.0), _state(2.0), _state(3.0)], 1)
  assert _files(store) == []
  assert [s[0][0] for s in store.load(["c", "a", "new"])] == [3.0, 1.0, 0.0]
  store.flush()
  assert _files(store) == ["a.npz", "b.npz", "c.npz"]
  reopened = ClientStateStore(tmp_path / "s", _state(0.0), memory_bytes=0)
  assert [s[0][0] for s in reopened.load(["a", "b", "c"])] == [1.0, 2.0, 3.0]
  assert reopened.last_updated(["a", "new"]) == [1, None]


def test_the_least_recently_used_states_spill_and_come_back(tmp_path):
  store = ClientStateStore(tmp_path / "s", _state(0.0), memory_bytes=2 * STATE_BYTES)
  store.save(["a", "b"], [_state(1.0), _state(2.0)], 1)
  store.load(["a"])  # b is now the least recently used
  store.save(["c"], [_state(3.0)], 2)
  assert _files(store) == ["b.npz"]  # spilled, with its round
  assert store.last_updated(["b", "c", "a"]) == [1, 2, 1]
  # Reading b back pushed another state out; a changed state is written as it goes.
  assert [s[0][0] for s in store.load(["a", "b", "c"])] == [1.0, 2.0, 3.0]
  store.flush()
  assert _files(store) == ["a.npz", "b.npz", "c.npz"]


@pytest.mark.parametrize("budget", [0, STATE_BYTES, 2 * STATE_BYTES, 1 << 20])
def test_any_budget_gives_the_same_states_and_ages(tmp_path, budget):
  """A sequence of rounds against a plain dict of what each client last saved."""
  rng = np.random.default_rng(0)
  store = ClientStateStore(tmp_path / str(budget), _state(0.0), memory_bytes=budget)
  want, updated = {}, {}
  for round_num in range(1, 30):
    ids = [f"c{i}" for i in rng.choice(6, size=3, replace=False)]
    got = [s[0][0] for s in store.load(ids)]
    assert got == [want.get(cid, 0.0) for cid in ids]
    assert store.last_updated(ids) == [updated.get(cid) for cid in ids]
    values = rng.normal(size=3)
    store.save(ids, [_state(v) for v in values], round_num)
    want.update(zip(ids, np.float32(values)))
    updated.update((cid, round_num) for cid in ids)
    if round_num % 7 == 0:
      store.flush()
      on_disk = ClientStateStore(store.directory, _state(0.0), memory_bytes=0)
      assert [s[0][0] for s in on_disk.load(list(want))] == list(want.values())


def _rows(values):
  """States as rows of one buffer, as a compiled round returns its clients' new states."""
  buffer = np.repeat(np.asarray(values, np.float32)[:, None], 4, axis=1)
  return buffer, [(row,) for row in buffer]


def test_rows_of_a_buffer_stay_views_while_half_of_it_is_held(tmp_path):
  store = ClientStateStore(tmp_path / "s", _state(0.0), memory_bytes=1 << 20)
  ids = ["a", "b", "c", "d"]
  buffer, states = _rows([1.0, 2.0, 3.0, 4.0])
  store.save(ids, states, 1)

  def views():
    return [state[0].base is buffer for state in store.load(ids)]

  assert views() == [True] * 4
  store.save(["a", "b"], [_state(5.0), _state(6.0)], 2)
  assert views() == [False, False, True, True]  # half of it held: kept
  store.save(["c"], [_state(7.0)], 3)
  assert views() == [False] * 4  # a quarter: d's row copied out, the buffer freed
  assert [s[0][0] for s in store.load(ids)] == [5.0, 6.0, 7.0, 4.0]
  _, again = _rows([8.0, 9.0, 10.0, 11.0])
  store.save(ids, again, 4)  # every row replaced at once
  assert [s[0].base is again[0][0].base for s in store.load(ids)] == [True] * 4
  partial, rows = _rows([12.0, 13.0, 14.0, 15.0])
  store.save(["e"], rows[:1], 5)  # one row of four taken: copied at once
  assert store.load(["e"])[0][0].base is not partial
  assert store.load(["e"])[0][0][0] == 12.0


def test_buffers_kept_alive_are_at_most_twice_the_states_held(tmp_path):
  """Rounds of 6 of 16 clients, each round's states rows of one buffer: without
  copying out, rows left behind would keep most old buffers alive."""
  rng = np.random.default_rng(0)
  population = [f"c{i}" for i in range(16)]
  store = ClientStateStore(tmp_path / "s", _state(0.0), memory_bytes=16 * STATE_BYTES)
  for round_num in range(1, 40):
    ids = list(rng.choice(population, 6, replace=False))
    store.save(ids, _rows(rng.normal(size=6))[1], round_num)
    held = [state[0] for state in store.load(population)]
    alive = {id(a if a.base is None else a.base): (a if a.base is None else a.base).nbytes
             for a in held}
    assert sum(alive.values()) <= 2 * sum(a.nbytes for a in held)
