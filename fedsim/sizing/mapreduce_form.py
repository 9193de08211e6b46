"""Per-client wire sizes from TFF's MapReduceForm of the round (compiled once
per process by `fedsim.backend.mapreduce`, which the in-process runtime
shares: what is sized is what runs)."""

from __future__ import annotations

import numpy as np
import tensorflow_federated as tff

from fedsim.errors import RunFailed, UserError
from fedsim.backend.computations import NotTensorFlow, tensor_leaves
from fedsim.backend.mapreduce import map_reduce_form
from fedsim.compression.encoded_sum import NOISE_ROUND_KEY
from fedsim.sizing import ClientWireBits


def _named_leaves(type_spec: tff.Type, path: str = "") -> list[tuple[str, tff.types.TensorType]]:
  """(slash-joined element names, tensor type) of every tensor in `type_spec`."""
  if isinstance(type_spec, tff.types.FederatedType):
    return _named_leaves(type_spec.member, path)
  if isinstance(type_spec, tff.types.StructType):
    return [leaf for i, (name, child) in enumerate(tff.structure.to_elements(type_spec))
            for leaf in _named_leaves(child, f"{path}/{name if name else i}")]
  return [(path.lstrip("/") or "value", type_spec)]


def type_bits(type_spec: tff.Type, measured: bool = False) -> int:
  """Bits of a value of `type_spec`: sum over tensors of elements x dtype bits.

  `measured`: tensors whose shape is not fully known count 0 here, because
  the round measures them (an encoder that reports its own bits, see
  `fedsim.compression.reports_own_bits`): the result is the fixed part.

  Raises:
    UserError: unless `measured`, naming the tensor (its path holds the
      encoding stages' names, e.g. `.../flattened_values/values`) whose shape
      is not fully known: its size depends on the values, which this static
      sizing does not see.
    ValueError: if the type holds something other than tensors, or strings.
  """
  total = 0
  try:
    tensor_leaves(type_spec)
  except NotTensorFlow as e:
    raise ValueError(f"cannot size a value: {e}") from None
  for path, leaf in _named_leaves(type_spec):
    if not tff.types.is_shape_fully_defined(leaf.shape):
      if measured:
        continue
      raise UserError(f"cannot size '{path}' ({leaf}): its shape depends on the values; an"
                      " encoder must send fixed shapes (e.g. top-k with a fixed k or fraction) or"
                      " report its own bits (e.g. threshold)")
    dtype = np.dtype(leaf.dtype)
    if dtype == np.bool_:
      bits = 8  # TensorFlow stores a bool in a byte
    elif dtype.kind in "SUO":
      raise ValueError(f"string tensor {leaf} has no static size")
    else:
      bits = dtype.itemsize * 8
    total += int(np.prod(leaf.shape, dtype=np.int64)) * bits
  return total


def client_wire_bits(process: tff.templates.IterativeProcess,
                     upload_extras_types=(), measured: bool = False) -> ClientWireBits:
  """Bits per client per round, both ways, of a fedsim-composed process.

  `measured`: an encoder of the run reports its own bits; tensors of
  value-dependent shape count 0 here (see `type_bits`) and the run adds what
  the round measured (`SizeInfo.round_metrics`).

  The model part of the broadcast is all of it but the round counters of
  encoded uploads (`NOISE_ROUND_KEY`, 32 bits each). The model part of the
  upload is everything the client hands to the aggregation except what its client-work stage adds besides the update: the
  training metrics it sums and the update weight (when the aggregation uses
  it). Both come from the compiled computations' types, not a formula.

  Raises:
    RunFailed: if the process cannot be compiled to a MapReduceForm.
  """
  try:
    form = map_reduce_form(process)
  except ValueError as e:
    raise RunFailed(f"cannot compile the process to a MapReduceForm for sizing: {e}") from e
  prepare = form.prepare.type_signature.result
  broadcast = type_bits(prepare, measured)
  # An encoded upload's round counter goes down with its encoder parameters.
  counters = sum(type_bits(leaf) for path, leaf in _named_leaves(prepare)
                 if path.rsplit("/", 1)[-1] == NOISE_ROUND_KEY)
  uploads = form.work.type_signature.result
  # Slots 1..3 feed secure sums; fedsim's aggregations do not use them, but if
  # an aggregator does, their bits cross the wire too.
  aggregate = sum(type_bits(slot, measured) for slot in uploads)
  extras = sum(type_bits(t) for t in upload_extras_types)
  return ClientWireBits(
      broadcast=broadcast, broadcast_model=broadcast - counters,
      aggregate=aggregate, aggregate_model=aggregate - extras)
