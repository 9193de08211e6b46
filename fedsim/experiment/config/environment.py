"""`fedsim validate` beyond the config's own keys: does it fit this machine?

Checked without TensorFlow: the SQLite files of TFF's datasets exist, every
`builder: "module:function"` (custom datasets, Keras models, aggregation
factories) imports and has that attribute, `runtime.device: gpu` has a GPU
driver to use, and the datasets that build quickly from NumPy (the `quick`
trait: digits) are built as a run builds them, so that what their data
cannot meet (more clients than examples, a round's sample larger than the
clients) is refused here as in a run. What needs TensorFlow or a run (a
file's contents, what a builder returns, whether TensorFlow can use the GPU)
is reported as "not checked" instead.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Any, Iterator, Sequence

from fedsim.experiment.config.schema import ExperimentConfig
from fedsim.config.typed import Component
from fedsim.data import DATASETS, tff_files, tff_sqlite
from fedsim.errors import UserError
from fedsim.experiment.population import check_sample, training_data
from fedsim.registry import resolve

# Where the NVIDIA driver lists GPUs on Linux (one directory per device).
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def check_environment(runs: Sequence[tuple[str | None, ExperimentConfig]]) -> list[str]:
  """Checks each run's config against this machine without importing TensorFlow.

  Args:
    runs: (variant name or None, config), as `expand_variants` returns them.

  Returns:
    What could not be checked here, one line each (no duplicates).

  Raises:
    UserError: naming the key (after `variants.<name>:` for a variant) of a
      missing dataset file, a builder that does not import, or a GPU asked
      for where there is none.
  """
  notes: list[str] = []
  errors: dict[str | None, str] = {}
  for variant, config in runs:
    try:
      for note in _check(config):
        if note not in notes:
          notes.append(note)
    except UserError as e:
      errors[variant] = str(e)
  if errors:
    variant, message = next(iter(errors.items()))
    # Name the variant only when it matters: not when every run fails alike.
    if variant is None or (len(errors) == len(runs) and len(set(errors.values())) == 1):
      raise UserError(message)
    raise UserError(f"variants.{variant}: {message}")
  return notes


def _check(config: ExperimentConfig) -> Iterator[str]:
  yield from _data_files(config)
  if DATASETS.get(config.data.name, "data.name").traits["quick"]:
    check_sample(config, training_data(config))   # as a run builds it: UserError naming the key
  for key, params in components(config):
    builder = getattr(params, "builder", None)
    if isinstance(builder, str) and ":" in builder:
      resolve(builder, key=key)  # imports the module: UserError naming the key
      yield f"not checked: what {key}.builder {builder} returns (it runs in a run)"
  from fedsim.runtime.runtime_registry import runtime_of
  if runtime_of(config.runtime.name).device(config.runtime.params) == "gpu":
    yield from _gpu()


def _data_files(config: ExperimentConfig) -> Iterator[str]:
  params = config.data.params
  if config.data.name in tff_sqlite.FILES and isinstance(params, tff_files.TffFileParams):
    path = tff_sqlite.locate(config.data.name, params.cache_dir, key="data")
    yield f"not checked: the contents of {path} (read when a run opens it)"


def components(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
  """(dotted key, params) of every registry entry chosen anywhere in a parsed config."""
  if isinstance(node, Component):
    yield key, node.params
    yield from components(node.params, key)
  elif isinstance(node, (list, tuple)):
    for i, item in enumerate(node):
      yield from components(item, f"{key}[{i}]")
  elif dataclasses.is_dataclass(node) and not isinstance(node, type):
    for field in dataclasses.fields(node):
      yield from components(getattr(node, field.name), f"{key}.{field.name}" if key else field.name)


def _gpu() -> Iterator[str]:
  """Notes for `runtime.device: gpu`; UserError when this machine has no NVIDIA GPU."""
  listed = os.path.isdir(NVIDIA_GPUS) and bool(os.listdir(NVIDIA_GPUS))
  if listed or shutil.which("nvidia-smi"):
    yield ("not checked: that TensorFlow can use the GPU (runtime.device: gpu; its CUDA"
           " libraries load in a run)")
  elif os.path.isdir("/proc"):
    raise UserError(f"runtime.device: gpu, but this machine shows no GPU (no {NVIDIA_GPUS},"
                    " no nvidia-smi); use device: auto or cpu")
  else:
    yield "not checked: runtime.device: gpu (no /proc here to look for a GPU driver)"
