"""TFF's MapReduceForm of a process, compiled once and shared by sizing and the
in-process runtime (the only fedsim module that compiles to it, so an upstream
change touches one file)."""

from __future__ import annotations

import weakref

import tensorflow_federated as tff

_FORMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def map_reduce_form(process: tff.templates.IterativeProcess):
  """TFF's MapReduceForm of `process.next`, compiled once per process object.

  Sizing and the in-process runtime both need it; a compile takes 0.5-0.8 s.

  Raises:
    ValueError: the process has no MapReduceForm (the first line of TFF's reason).
  """
  if process not in _FORMS:
    from fedsim.backend.quiet import filtered_stderr
    try:
      # Grappler logs harmless "Failed to detect the fetch node(s)" errors here.
      with filtered_stderr():
        _FORMS[process] = tff.backends.mapreduce.get_map_reduce_form_for_computation(
            process.next)
    except Exception as e:  # TFF raises several internal error types here
      reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise ValueError(reason) from e
  return _FORMS[process]
