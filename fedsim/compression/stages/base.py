"""What every stage here shares: one compressible output, no parameters, no sum."""

from __future__ import annotations

import collections

from fedsim.compression import tensor_encoding_api as te_api


class PerClientStage(te_api.EncodingStageInterface):
  """A stateless stage whose encoding depends on each client's own value.

  It does not commute with the sum (each client has its own scale,
  coordinates or rotation), so the server decodes each client's value before
  summing; only `ENCODED_VALUES_KEY` may be encoded further by a later stage,
  and there are no shared parameters. Subclasses set `ENCODED_VALUES_KEY`,
  `name`, `encode` and `decode`, and are decorated with
  `te_api.tf_style_encoding_stage`.
  """

  ENCODED_VALUES_KEY = "values"

  @property
  def compressible_tensors_keys(self):
    return [self.ENCODED_VALUES_KEY]

  @property
  def commutes_with_sum(self):
    return False

  @property
  def decode_needs_input_shape(self):
    return False

  def get_params(self):
    return collections.OrderedDict(), collections.OrderedDict()
