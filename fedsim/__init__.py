"""fedsim: federated learning simulation on TensorFlow Federated.

    import fedsim
    result = fedsim.run("experiments/quickstart.yaml", ["rounds=5"])
    result.metrics[-1]["eval/accuracy"], result.size_info.aggregate_bits

Importing fedsim is light; TensorFlow is imported when a run starts.
"""

from fedsim.errors import HostError, RunFailed, UserError

# The rest loads on first use: `python -m fedsim.cli` and the `fedsim` command
# import this package first, and `fedsim run` installs its signal handlers only
# after that (a Ctrl-C in the ~0.5-2 s that pydantic's schema and NumPy took
# gave a KeyboardInterrupt traceback; a SIGTERM, exit -15).
_LAZY = {"run": "fedsim.api", "validate": "fedsim.api",
         "RoundInfo": "fedsim.experiment.round_info",
         "Callback": "fedsim.experiment.callbacks.callback"}


def __getattr__(name: str):
  if name in _LAZY:
    import importlib  # pylint: disable=g-import-not-at-top
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'fedsim' has no attribute {name!r}")

__all__ = ["run", "validate", "Callback", "HostError", "RoundInfo", "RunFailed", "UserError"]
