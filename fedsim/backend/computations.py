"""TFF TensorFlow computations as functions of the Python process's TensorFlow.

A compiled TFF computation whose body is TensorFlow carries a serialized
GraphDef plus the names of the tensors its parameter and result bind to.
Importing that graph into a `tf.compat.v1.wrap_function` gives a
ConcreteFunction: callable eagerly, from inside other `tf.function`s and on
any device, with no TFF runtime involved. This is the only fedsim module that
reads TFF's computation protos, so an upstream change touches one file.

Values cross as flat lists of tensors in the depth-first order of the TFF
type's leaves, which is also the order of the computation's bindings.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.computation import computation_impl
from tensorflow.python.eager import context as _tf_context

from fedsim.backend import onednn

try:  # TensorFlow's own constructor of eager tensors (private; see `eager_tensors`)
  from tensorflow.python.framework.ops import EagerTensor as _EagerTensor
except ImportError:
  _EagerTensor = None


class NotTensorFlow(Exception):
  """A computation or value cannot be run as plain TensorFlow in this process."""


def tensor_leaves(type_spec: tff.Type | None) -> list[tff.types.TensorType]:
  """The tensor types of a (nested) TFF type, depth first; [] for None.

  Raises:
    NotTensorFlow: the type holds a sequence (tf.data), function or other
      non-tensor member.
  """
  return list(_leaves(type_spec)) if type_spec is not None else []


def _leaves(type_spec) -> Iterator[tff.types.TensorType]:
  if isinstance(type_spec, tff.types.TensorType):
    yield type_spec
  elif isinstance(type_spec, tff.types.StructType):
    for child in type_spec.children():
      yield from _leaves(child)
  elif isinstance(type_spec, tff.types.FederatedType):
    yield from _leaves(type_spec.member)
  else:
    raise NotTensorFlow(f"values of type {type_spec} are not tensors")


def tensor_specs(type_spec) -> list[tf.TensorSpec]:
  """A `tf.TensorSpec` per tensor leaf of `type_spec` (see `tensor_leaves`)."""
  return [tf.TensorSpec(t.shape, tf.as_dtype(t.dtype)) for t in tensor_leaves(type_spec)]


def flatten(value: Any, type_spec) -> list[Any]:
  """The leaves of a Python value (containers TFF accepts) in `type_spec`'s order.

  Elements of a named struct are looked up by name (mappings, attrs classes,
  namedtuples), unnamed ones by position.
  """
  if type_spec is None:
    return []
  out = []
  flattener(type_spec)(value, out.append)
  return out


@functools.lru_cache(maxsize=256)
def flattener(type_spec) -> Callable[[Any, Callable[[Any], None]], None]:
  """`flatten` for one type: `(value, emit)` calls `emit(leaf)` per leaf, in order.

  The type is walked once, not on every call (a round flattens its state).
  """
  if isinstance(type_spec, tff.types.FederatedType):
    return flattener(type_spec.member)
  if isinstance(type_spec, tff.types.TensorType):
    return lambda value, emit: emit(value)
  elements = tuple((i, name, flattener(child))
                   for i, (name, child) in enumerate(tff.structure.iter_elements(type_spec)))

  def walk(value, emit):
    by_key = hasattr(value, "keys")  # a tff Struct has none: attributes and positions
    for i, name, child in elements:
      if name is None:
        child(value[i], emit)
      elif by_key:
        child(value[name], emit)
      else:
        child(getattr(value, name), emit)

  return walk


def pack(leaves: Sequence[Any], type_spec) -> Any:
  """The inverse of `flatten`: leaves in the Python containers of `type_spec`.

  Tensors become NumPy values, as TFF's own runtimes return them.
  """
  return packer(type_spec)(leaves)


@functools.lru_cache(maxsize=256)
def packer(type_spec) -> Callable[[Sequence[Any]], Any]:
  """`pack` for one type as a function of the leaves, its containers looked up once.

  A round's result type is walked once instead of on every call (~0.4 ms of
  a 10 ms round on small models). Types TFF's containers allow but the plan
  does not cover (mixed named and unnamed elements, unplaced sequences) fall
  back to walking the type per call.
  """
  try:
    build = _plan(type_spec)
  except _NoPlan:
    def generic(leaves):
      struct = _pack_struct(iter(leaves), type_spec)
      return tff.types.type_to_py_container(struct, type_spec)
    return generic
  return lambda leaves: build(iter(leaves))


class _NoPlan(Exception):
  pass


def _leaf_value(value):
  return value.numpy() if isinstance(value, tf.Tensor) else np.asarray(value)


def _plan(type_spec) -> Callable[[Iterator[Any]], Any]:
  """A function building `type_to_py_container`'s value of `type_spec` from leaves."""
  if isinstance(type_spec, tff.types.FederatedType):
    if not type_spec.all_equal:
      raise _NoPlan()
    return _plan(type_spec.member)
  if isinstance(type_spec, tff.types.TensorType):
    return lambda it: _leaf_value(next(it))
  if not isinstance(type_spec, tff.types.StructType):
    raise _NoPlan()
  elements = list(tff.structure.iter_elements(type_spec))
  names = tuple(name for name, _ in elements)
  children = tuple(_plan(child) for _, child in elements)
  named = sum(name is not None for name in names)
  if named not in (0, len(names)):
    raise _NoPlan()
  container = type_spec.python_container or (collections.OrderedDict if named else tuple)
  if named and (container in (tuple, list) or (
      isinstance(container, type) and issubclass(container, tuple) and
      not hasattr(container, "_fields"))):
    raise _NoPlan()  # TFF refuses names in a container without them
  if named and (hasattr(container, "_fields") or attrs.has(container)):
    return lambda it: container(**{n: c(it) for n, c in zip(names, children)})
  if named:
    return lambda it: container([(n, c(it)) for n, c in zip(names, children)])
  if hasattr(container, "_fields") or attrs.has(container):
    raise _NoPlan()
  return lambda it: container([c(it) for c in children])


def _pack_struct(it: Iterator[Any], type_spec):
  if isinstance(type_spec, tff.types.FederatedType):
    return _pack_struct(it, type_spec.member)
  if isinstance(type_spec, tff.types.TensorType):
    value = next(it)
    return value.numpy() if isinstance(value, tf.Tensor) else np.asarray(value)
  return tff.structure.Struct([
      (name, _pack_struct(it, child))
      for name, child in tff.structure.iter_elements(type_spec)])


def eager_tensors(values: Sequence[Any], specs: Sequence[tf.TensorSpec]) -> list[tf.Tensor]:
  """`values` as eager tensors of the dtypes of `specs` (shapes are not checked).

  A NumPy value already of its spec's dtype becomes a tensor straight
  through TensorFlow's private `EagerTensor` constructor, ~4 us instead of
  `tf.convert_to_tensor`'s ~12 us (a round converts ~10-20 leaves); any
  other value goes through `tf.convert_to_tensor`, with its checks. A tensor
  may share memory with its NumPy value (TensorFlow does so for suitably
  aligned arrays): the values must not change while the tensors are in use.
  """
  context = _tf_context.context()
  context.ensure_initialized()  # the constructor needs it; the first op of a process makes it
  device = context.device_name
  out = []
  for value, spec in zip(values, specs):
    if (_EagerTensor is not None and isinstance(value, (np.ndarray, np.generic)) and
        value.dtype == spec.dtype.as_numpy_dtype):
      out.append(_EagerTensor(value, device, spec.dtype.as_datatype_enum))
    else:
      out.append(tf.convert_to_tensor(value, spec.dtype))
  return out


def graph_function(input_signature=None) -> Callable[[Callable], Any]:
  """`tf.function` without AutoGraph, for the graphs fedsim writes itself.

  They use TensorFlow's control flow (`tf.while_loop`, `tf.cond`) and call
  code that TFF also traces, which TFF does without AutoGraph, so converting
  them changes nothing but the build time: AutoGraph parses and rewrites the
  source of every function such a graph calls (~7 s of a whole test run's
  tracing, in a profile), and a coverage tool cannot see the rewritten copies
  run.
  """
  return tf.function(input_signature=input_signature, autograph=False)


def direct_call(function) -> Callable[[Sequence[tf.Tensor]], list[tf.Tensor]]:
  """A traced `tf.function`'s graph as a function of its flat input tensors.

  Returns `call(tensors) -> flat outputs`, where `tensors` are eager tensors
  in `tf.nest.flatten` order of `function`'s input signature, of its dtypes
  and shapes (not checked here). A ConcreteFunction's own `__call__` binds,
  checks and casts its structured arguments on every call, ~0.3 ms for a
  round's ~20 leaves; this runs the traced graph straight away. It relies on
  TensorFlow's private `_inference_function` (TF 2.14); without it, the
  public call is used.
  """
  inference = getattr(function, "_inference_function", None)
  captured = tuple(function.captured_inputs)
  if inference is not None and callable(inference):
    return lambda tensors: inference(*tensors, *captured)
  structure = function.structured_input_signature[0]

  def public(tensors):
    return tf.nest.flatten(function(*tf.nest.pack_sequence_as(structure, list(tensors))))

  return public


def _binding_names(binding) -> list[str]:
  kind = binding.WhichOneof("binding")
  if kind == "tensor":
    return [binding.tensor.tensor_name]
  if kind == "struct":
    return [name for element in binding.struct.element for name in _binding_names(element)]
  raise NotTensorFlow(f"a '{kind}' binding (e.g. a tf.data dataset) is not a tensor")


class FormPhases(NamedTuple):
  """A MapReduceForm's phases as `concrete_function`s, one field per phase."""

  prepare: Any
  work: Any
  zero: Any
  accumulate: Any
  merge: Any
  report: Any
  update: Any


def form_phases(form, device: str | None = None) -> FormPhases:
  """Every phase of the MapReduceForm `form` as a `concrete_function` for `device`.

  Raises:
    NotTensorFlow: a phase is not plain TensorFlow.
  """
  return FormPhases(*(concrete_function(getattr(form, name), name, device)
                      for name in FormPhases._fields))


def concrete_function(computation: tff.Computation, name: str = "computation",
                      device: str | None = None):
  """`computation` as a `tf` ConcreteFunction of its flat parameter leaves.

  The function returns the flat list of its result's leaves. It holds no
  variables: each call is a pure function of its arguments (random ops draw
  fresh numbers, as on TFF's runtime). `device`: where the caller places it;
  on a CPU with oneDNN, max-pooling gradients are made sure of oneDNN's kernel
  (`fedsim.backend.onednn`).

  Raises:
    NotTensorFlow: `computation` is not a TensorFlow computation, has
      variables to initialize, or takes or returns non-tensor values.
  """
  proto = computation_impl.ConcreteComputation.get_proto(computation)
  kind = proto.WhichOneof("computation")
  if kind != "tensorflow":
    raise NotTensorFlow(f"{name} is a '{kind}' computation, not TensorFlow")
  body = proto.tensorflow
  if body.initialize_op:
    raise NotTensorFlow(f"{name} uses TensorFlow variables")
  graph_def = tf.compat.v1.GraphDef()
  body.graph_def.Unpack(graph_def)
  if device is not None and onednn.applies(device):
    graph_def = onednn.pair_max_pools(graph_def)
  signature = computation.type_signature
  in_names = _binding_names(body.parameter) if body.HasField("parameter") else []
  out_names = _binding_names(body.result)
  in_specs = tensor_specs(signature.parameter)
  if len(in_specs) != len(in_names) or len(tensor_leaves(signature.result)) != len(out_names):
    raise NotTensorFlow(f"{name}: bindings do not match its type {signature}")
  token = body.session_token_tensor_name
  token_node = next((n for n in graph_def.node if token and n.name == token.split(":")[0]),
                    None)
  token_dtype = tf.as_dtype(token_node.attr["dtype"].type) if token_node is not None else None

  def imported(*args):
    input_map = dict(zip(in_names, args))
    if token_dtype is not None:
      # Only TFF's session-scoped resources read the token; a run here has none.
      input_map[token] = tf.zeros([], token_dtype)
    return tf.graph_util.import_graph_def(
        graph_def, input_map=input_map, return_elements=out_names, name=name)

  return tf.compat.v1.wrap_function(imported, in_specs, name=name)
