"""`quiet.filtered_first_call`: a compiled round's noise is filtered at its first call only."""

from __future__ import annotations

import os

import pytest

from fedsim.backend import quiet

NOISE = (b"2026-11-28 19:36:27.728924: E tensorflow/core/grappler/optimizers/"
         b"grappler_item_builder.cc:670] Failed to detect the fetch node(s), skipping\n")
REAL = b"a real error\n"


class _Round:
  """Stands for a compiled round (any weakly referable object)."""


def _call(calls, fail: bool = False) -> None:
  with quiet.filtered_first_call(calls):
    os.write(2, NOISE + REAL)
    if fail:
      raise RuntimeError("the round failed")


def test_each_callee_and_way_is_filtered_at_its_first_call_only(capfd):
  first, second = _Round(), _Round()
  _call([(first, "round")])                       # compiles: filtered
  _call([(first, "round")])                       # unfiltered
  _call([(first, "phases")])                      # its phases compile: filtered
  _call([(first, "round"), (second, "round")])    # one callee new: filtered
  _call([(second, "round"), (first, "phases")])   # unfiltered
  assert capfd.readouterr().err.encode() == (REAL + (NOISE + REAL) + REAL + REAL
                                             + (NOISE + REAL))


def test_a_first_call_that_raised_is_filtered_again(capfd):
  round_ = _Round()
  with pytest.raises(RuntimeError):
    _call([(round_, "round")], fail=True)
  _call([(round_, "round")])
  _call([(round_, "round")])
  assert capfd.readouterr().err.encode() == REAL + REAL + (NOISE + REAL)


def test_a_callee_without_weak_references_is_filtered_at_every_call(capfd):
  _call([((1, 2), "round")])
  _call([((1, 2), "round")])
  assert capfd.readouterr().err.encode() == REAL + REAL
