"""TFF's MapReduceForm of a process, compiled once and shared by sizing and the
compiled runtimes (the only fedsim module that compiles to it, so an upstream
change touches one file)."""

from __future__ import annotations

import weakref

import tensorflow as tf
import tensorflow_federated as tff

_FORMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# TFF runs Grappler (aggressive constant folding, arithmetic, loop and memory
# passes) over every graph it extracts, about 40% of a compile. TensorFlow runs
# Grappler again when the runtime first calls a graph, so skipping TFF's pass
# changed neither a round's results (bit for bit) nor its time (bench/compile.py,
# figures in docs/explain/runtime.md).
_NO_GRAPPLER = tf.compat.v1.ConfigProto()
_NO_GRAPPLER.graph_options.rewrite_options.disable_meta_optimizer = True


def map_reduce_form(process: tff.templates.IterativeProcess):
  """TFF's MapReduceForm of `process.next`, compiled once per process object.

  Sizing and the compiled runtimes both need it; a compile takes ~0.5 s (an MLP's FedAvg).

  Raises:
    ValueError: the process has no MapReduceForm (the first line of TFF's reason).
  """
  if process not in _FORMS:
    _FORMS[process] = compile_form(process.next)
  return _FORMS[process]


def compile_form(computation: tff.Computation):
  """TFF's MapReduceForm of a federated `computation`, compiled now (uncached)
  as fedsim compiles every round, without TFF's Grappler pass.

  Raises:
    ValueError: as `map_reduce_form`.
  """
  from fedsim.backend.quiet import filtered_stderr
  try:
    # TensorFlow's known harmless lines (fedsim.backend.quiet), should TFF's
    # compile print any, stay off the run's stderr; other lines pass.
    with filtered_stderr():
      return tff.backends.mapreduce.get_map_reduce_form_for_computation(
          computation, _NO_GRAPPLER)
  except Exception as e:  # TFF raises several internal error types here
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(reason) from e


def state_initialization(initialize: tff.Computation) -> tff.Computation:
  """`initialize` as one TensorFlow computation placed at the server, for a
  compiled runtime to call as a graph."""
  return tff.backends.mapreduce.get_state_initialization_computation(initialize, _NO_GRAPPLER)
