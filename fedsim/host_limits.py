"""What this process may use of the machine, checked before TensorFlow loads.

Under a low `ulimit -v` TensorFlow does not fail in one way: measured on
digits/logistic (2 cores, TF 2.14), 1 GB gave a 44-line ImportError ('failed
to map segment from shared object'), 2 GB a silent SIGABRT inside its C++
start-up, 2.5 GB a RuntimeError ('can't start new thread') from gRPC with a
52-line traceback, 2.86 GB ran. So a limit below MIN_ADDRESS_SPACE is refused
up front in one line, and the out-of-memory errors that can still come later
(a larger model) are recognised by `is_out_of_memory` for the CLI to print in
one line. Imports no TensorFlow.
"""

from __future__ import annotations

import resource

MIN_ADDRESS_SPACE = 3 << 30  # bytes


def check_address_space() -> str | None:
  """One line saying the address-space limit is too low for TensorFlow, or None."""
  soft, _ = resource.getrlimit(resource.RLIMIT_AS)
  if soft == resource.RLIM_INFINITY or soft >= MIN_ADDRESS_SPACE:
    return None
  return (f"ulimit -v: this process may map {soft / 2**30:.1f} GiB; TensorFlow needs at"
          f" least {MIN_ADDRESS_SPACE >> 30} GiB (raise the limit with ulimit -v)")


def is_out_of_memory(error: BaseException) -> bool:
  """Whether `error` is how Python or TensorFlow's loading reports too little memory."""
  text = str(error)
  return (isinstance(error, MemoryError)
          or (isinstance(error, ImportError) and "failed to map segment" in text)
          or (isinstance(error, RuntimeError) and "can't start new thread" in text))
