"""fedsim: federated learning simulation on TensorFlow Federated.

    import fedsim
    result = fedsim.run("experiments/quickstart.yaml", ["rounds=5"])
    result.metrics[-1]["eval/accuracy"], result.size_info.aggregate_bits

Importing fedsim is light; TensorFlow is imported when a run starts.
"""

from fedsim.api import run, validate
from fedsim.errors import HostError, RunFailed, UserError
from fedsim.experiment.round_info import RoundInfo

__all__ = ["run", "validate", "HostError", "RoundInfo", "RunFailed", "UserError"]
