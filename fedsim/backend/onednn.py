"""Max-pooling's gradient on TensorFlow's oneDNN kernel in every compiled round.

On a CPU, TensorFlow's oneDNN layout pass (a graph pass that runs when a graph is
first called, after Grappler) turns each `MaxPoolGrad` into oneDNN's kernel only if,
when the pass reaches it, its `orig_output` input comes straight from a `MaxPool`
the pass has already turned into oneDNN's (whose workspace the gradient then reads).
The pass walks the graph depth first from its sources, in an order set by edge-set
hashing. In a training loop the backward pass leads through the loop back to the
next step's forward pass, so depending on that order the pass reaches a gradient
before its pool, and leaves it on TensorFlow's own kernel: ~10x slower at W1's
shapes (per step 4.6 vs 0.5 ms for a 20x28x28x32 pool and its gradient, 3.1 vs 0.2
ms at 20x14x14x64, one thread). Which one a process got was a draw per gradient
(TensorFlow's kernel in 15 of 20 builds of fedsim's W1 round, and in 1 of 6 of the
hand-written reference loop; docs/explain/runtime.md).

Naming each pool as oneDNN's own op, with its workspace on, before TensorFlow sees
the graph makes every gradient's check pass whatever the order. The results are
those of the oneDNN gradient, which the pass picks when the order is favourable.
TensorFlow's op names for oneDNN are internal: this is the one fedsim module that
uses them, and it changes nothing when they are absent.
"""

from __future__ import annotations

import itertools

import tensorflow as tf

try:  # whether this TensorFlow runs oneDNN's kernels (TF_ENABLE_ONEDNN_OPTS)
  from tensorflow.python.util import _pywrap_util_port
except ImportError:  # pragma: no cover (other TF layouts)
  _pywrap_util_port = None

# The oneDNN forward pool with a workspace output, as the layout pass names it, and
# the kernel label its CPU kernels are registered under.
_ONEDNN_MAX_POOL = "_MklNativeMaxPool"
_KERNEL_LABEL = b"MklNameChangeOp"
_renames = itertools.count()


def applies(device: str) -> bool:
  """Whether graphs placed on `device` run oneDNN's layout pass (a CPU, oneDNN on)."""
  if "GPU" in device.upper() or _pywrap_util_port is None:
    return False
  try:
    from tensorflow.python.framework import op_def_registry
    return bool(_pywrap_util_port.IsMklEnabled()) and (
        op_def_registry.get(_ONEDNN_MAX_POOL) is not None)
  except Exception:  # pylint: disable=broad-except  # any doubt: leave graphs alone
    return False


def pair_max_pools(graph_def: tf.compat.v1.GraphDef) -> tf.compat.v1.GraphDef:
  """`graph_def` with its float32 `MaxPool`s as oneDNN's, when it also has a `MaxPoolGrad`.

  Returns `graph_def` itself when it has nothing to change (no gradient of a
  pool: evaluation, MLPs); else a copy whose library functions carry a suffix
  new to this process, since TensorFlow keeps one definition per function
  name and TFF's own graphs already registered these names with `MaxPool`.
  """
  nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
  if not any(n.op == "MaxPoolGrad" for n in nodes) or not any(_pairable(n) for n in nodes):
    return graph_def
  out = tf.compat.v1.GraphDef()
  out.CopyFrom(graph_def)
  for node in [*out.node, *(n for f in out.library.function for n in f.node_def)]:
    if _pairable(node):
      node.op = _ONEDNN_MAX_POOL
      node.attr["workspace_enabled"].b = True
      node.attr["_kernel"].s = _KERNEL_LABEL
  _rename_functions(out, f"_onednn{next(_renames)}")
  return out


def _pairable(node) -> bool:
  if node.op != "MaxPool":
    return False
  attr = node.attr  # read with `get`: indexing a proto map adds the key
  dtype = attr.get("T")
  layout = attr.get("data_format")
  padding = attr.get("padding")
  return ((dtype is None or dtype.type == tf.float32.as_datatype_enum) and
          (layout is None or layout.s == b"NHWC") and
          padding is not None and padding.s in (b"SAME", b"VALID"))


def _rename_functions(graph_def, suffix: str) -> None:
  """Appends `suffix` to every library function's name and to every reference to it."""
  names = {f.signature.name for f in graph_def.library.function}

  def fix_attr(value):
    if value.HasField("func") and value.func.name in names:
      value.func.name += suffix
    if value.HasField("list"):
      for func in value.list.func:
        if func.name in names:
          func.name += suffix

  def fix_nodes(nodes):
    for node in nodes:
      if node.op in names:  # a function called as an op
        node.op += suffix
      for value in node.attr.values():
        fix_attr(value)

  fix_nodes(graph_def.node)
  for function in graph_def.library.function:
    function.signature.name += suffix
    fix_nodes(function.node_def)
    for value in function.attr.values():
      fix_attr(value)
  for gradient in graph_def.library.gradient:
    if gradient.function_name in names:
      gradient.function_name += suffix
    if gradient.gradient_func in names:
      gradient.gradient_func += suffix
