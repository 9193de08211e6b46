"""fedsim's own entries of a registry, whatever plugins the tests loaded before.

A registry is process-wide, and xdist runs test modules in any order on a
worker: an exact list of a registry's names must leave out the entries that
another module's plugin registered (its builder lives outside `fedsim`).
"""

from __future__ import annotations

from fedsim.registry import Registry


def builtin_names(registry: Registry) -> list[str]:
  """The sorted names of `registry`'s entries that fedsim itself registers."""
  return [entry.name for entry in registry.entries()
          if entry.build.__module__.split(".")[0] == "fedsim"]
