"""fedsim: federated learning simulation on TensorFlow Federated.

    import fedsim
    result = fedsim.run("experiments/quickstart.yaml", ["rounds=5"])
    result.metrics[-1]["eval/accuracy"], result.size_info.aggregate_bits

Importing fedsim is light; TensorFlow is imported when a run starts.
"""

from fedsim.api import run, validate
from fedsim.errors import RunFailed, UserError

__all__ = ["run", "validate", "RunFailed", "UserError"]
