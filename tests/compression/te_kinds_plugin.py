"""A plugin registering every stage kind of test_tff_stages as encoder `te_KIND`,
loaded by runs (and Ray actors) through `plugins:`."""

from fedsim.compression import register_encoder


def _builder(kind: str):
  def build(params):
    del params
    from fedsim.compression import tensor_encoding_api as te_api
    from tests.compression.test_tff_stages import KINDS
    return te_api.chain(*KINDS[kind].build())
  return build


for _kind in ("identity", "flatten", "uniform_nearest", "uniform_stochastic", "hadamard_nearest",
              "hadamard_stochastic", "kashin_nearest", "clip_by_norm", "clip_by_value",
              "per_channel_nearest", "per_channel_stochastic", "prng_uniform",
              "per_channel_prng", "split_by_small_value"):
  register_encoder(f"te_{_kind}", reports_own_bits=True, replace=True)(_builder(_kind))
