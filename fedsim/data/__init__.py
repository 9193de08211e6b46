"""Datasets for federated simulation, by name.

`DATASETS` entries are `build(params, seed) -> FederatedData`; each takes its
own parameter dataclass, and everything random in it is a deterministic
function of the run seed. NumPy only: no TensorFlow here.
"""

from __future__ import annotations

from fedsim.registry import Registry

# quick: built in well under a second from NumPy alone, whatever its
# parameters (no TensorFlow, no file but a bundled one), so `fedsim validate`
# builds it and refuses what a run would refuse once its data is there: a
# fixed pool of examples split over more clients than it can fill (digits).
# Datasets that generate each client's examples cannot fail so and need not.
DATASETS = Registry("dataset", traits={"quick": False})

# Imported for their registrations; they need DATASETS, hence after it.
from fedsim.data import (cifar100, custom, digits, emnist,  # noqa: E402,F401
                         emnist_synthetic, leaf_synthetic, shakespeare, stackoverflow)
from fedsim.data.federated import (ClientBatching, Examples, FederatedData,  # noqa: E402
                                   Partitioning)

__all__ = ["DATASETS", "ClientBatching", "Examples", "FederatedData", "Partitioning"]
