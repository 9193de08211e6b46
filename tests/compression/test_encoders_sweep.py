"""experiments/encoders.yaml, the sweep behind the encoder table of docs/guides/compare-encoders.md, covers every
registered encoder on the upload, and the biased ones with and without error
feedback: an encoder added to fedsim but left out of the sweep fails here."""

from __future__ import annotations

import pathlib

import pytest

from fedsim.catalog import registries
from fedsim.experiment.config.loader import expand_variants, load_config
from tests.registries import builtin_names

SWEEP = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "encoders.yaml"
# identity is the `none` variant's upload; threshold has no size to compare
# at equal bits (its tau is absolute, so its bits depend on the task).
NOT_SWEPT = {"identity", "threshold"}
BIASED = {"sign", "topk", "randk", "drive", "powersgd"}  # EF matters most where C is biased


@pytest.fixture(scope="module")
def uploads() -> dict[str, tuple[str, bool]]:
  """variant -> (its upload's last stage: encoder name or stage name, error_feedback)."""
  _, raw = load_config(SWEEP, [])
  found = {}
  for name, config in expand_variants(raw):
    assert config.broadcast == () and config.compression is None, name  # uploads only
    if not config.aggregation:
      found[name] = ("identity", False)
      continue
    stage = config.aggregation[-1]
    if stage.name == "encode":
      found[name] = (stage.params.encoder.name, stage.params.error_feedback)
    else:
      found[name] = (stage.name, False)
  return found


def test_every_registered_encoder_is_swept(uploads):
  encoders = next(r for r in registries() if r.kind == "encoder")
  swept = {encoder for encoder, _ in uploads.values()}
  assert set(builtin_names(encoders)) - NOT_SWEPT <= swept
  assert "majority_vote" in swept  # signSGD's own aggregation stage
  assert uploads["none"] == ("identity", False)


def test_biased_encoders_run_with_and_without_error_feedback(uploads):
  for encoder in BIASED:
    assert {ef for swept, ef in uploads.values() if swept == encoder} == {False, True}, encoder
