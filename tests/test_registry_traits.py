"""Registry entries state their traits at registration, by names the registry declares."""

from __future__ import annotations

import dataclasses

import pytest

from fedsim.aggregation import (AGGREGATION_STAGES, COMPLETE, StageContext,
                                register_aggregation_stage, role_of)
from fedsim.compression import ENCODERS, register_encoder, reports_own_bits
from fedsim.config.typed import Component
from fedsim.registry import REGISTRIES, Registry


@pytest.fixture
def scratch():
  registry = Registry("scratch thing", traits={"fast": False, "cost": None})
  yield registry
  REGISTRIES.remove(registry)


def test_undeclared_traits_are_refused_when_registering(scratch):
  with pytest.raises(TypeError, match=r"^scratch thing 'a': unknown trait speedy; a scratch"
                                      r" thing declares: fast, cost$"):
    scratch.register("a", traits={"speedy": True})


def test_an_entry_has_every_declared_trait_with_its_default(scratch):
  scratch.register("a", traits={"fast": True})(lambda params: None)
  scratch.register("b")(lambda params: None)
  assert dict(scratch.get("a").traits) == {"fast": True, "cost": None}
  assert dict(scratch.get("b").traits) == {"fast": False, "cost": None}
  with pytest.raises(TypeError):  # read-only: traits are declared, not set afterwards
    scratch.get("a").traits["fast"] = False


def test_every_builtin_entry_reads_its_traits_from_the_registry():
  # Nothing is read back from attributes of builder functions any more.
  for registry in REGISTRIES:
    for entry in registry.entries():
      assert set(entry.traits) == set(registry.traits), (registry.kind, entry.name)
  assert AGGREGATION_STAGES.get("encode").traits["compresses"] is True
  assert AGGREGATION_STAGES.get("dp_gaussian").traits["privacy_ledger"] is not None
  assert ENCODERS.get("threshold").traits["reports_own_bits"] is True
  assert ENCODERS.get("uniform").traits["reports_own_bits"] is False


def test_a_plugin_states_a_stage_role_and_an_encoder_its_own_bits():
  @dataclasses.dataclass(frozen=True)
  class Params:
    complete: bool = True

  @register_aggregation_stage("traits_test_stage", Params,
                              role=lambda p: COMPLETE if p.complete else "wrap",
                              check_context=lambda params, context, key: None)
  def build(params, context: StageContext):
    """A stage whose role depends on its params."""

  @register_encoder("traits_test_encoder", reports_own_bits=True)
  def encoder(params):
    """An encoder with value-dependent shapes."""

  try:
    assert role_of(Component("traits_test_stage", Params())) == COMPLETE
    assert role_of(Component("traits_test_stage", Params(complete=False))) == "wrap"
    from fedsim.compression import parse_compression
    spec = parse_compression({"aggregation": {"encoder": "traits_test_encoder"}}).aggregation
    assert reports_own_bits(spec)
  finally:
    AGGREGATION_STAGES._entries.pop("traits_test_stage")
    ENCODERS._entries.pop("traits_test_encoder")
