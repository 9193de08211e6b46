"""Per-client wire sizes from TFF's MapReduceForm of the round (compiled once
per process by `fedsim.backend.mapreduce`, which the in-process runtime
shares: what is sized is what runs)."""

from __future__ import annotations

import math

import numpy as np
import tensorflow_federated as tff

from fedsim.errors import RunFailed, UserError
from fedsim.backend.computations import NotTensorFlow, concrete_function, tensor_leaves
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

  A secure sum's value crosses the wire as its protocol's integers, not as
  the tensors' dtype: see `secure_sum_bits`.

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
  # Slot 0 is summed in the clear; slots 1..3 feed secure sums (`secure`, `ddp`).
  aggregate = type_bits(uploads[0], measured) + secure_sum_bits(form)
  extras = sum(type_bits(t) for t in upload_extras_types)
  return ClientWireBits(
      broadcast=broadcast, broadcast_model=broadcast - counters,
      aggregate=aggregate, aggregate_model=aggregate - extras)


def secure_sum_bits(form) -> int:
  """Bits one client sends into the round's secure sums: per element, the
  width the compiled round declares for it (`federated_secure_sum_bitwidth`'s
  bitwidth, the bits of `federated_secure_sum`'s max input, or of
  `federated_secure_modular_sum`'s modulus), not its dtype (an int64 or
  int32 that carries a 12-bit value).

  A protocol that sums n such values exactly masks them in a field of
  bitwidth + ceil(log2 n) bits (Bonawitz et al. 2017); `ddp` reduces its sum
  modulo 2^bits, so its field is the bitwidth itself (Kairouz et al. 2021 count
  it so). The protocol's key agreement and unmasking are not counted.
  """
  uploads = form.work.type_signature.result
  widths = (form.secure_sum_bitwidth, form.secure_sum_max_input,
            form.secure_modular_sum_modulus)
  total = 0
  for kind, (slot, computation) in enumerate(zip(uploads[1:], widths)):
    leaves = tensor_leaves(slot)
    if not leaves:
      continue
    values = [np.asarray(v) for v in concrete_function(computation, "secure_widths")()]
    if len(values) == 1 and len(leaves) > 1:   # one width for every tensor
      values = values * len(leaves)
    for leaf, value in zip(leaves, values):
      if not tff.types.is_shape_fully_defined(leaf.shape):
        raise UserError(f"cannot size a secure sum of {leaf}: its shape depends on the values")
      width = int(np.max(value))
      bits = width if kind == 0 else max(1, math.ceil(math.log2(width + (kind == 1))))
      total += int(np.prod(leaf.shape, dtype=np.int64)) * bits
  return total
