"""Reads TensorBoard event files the way TensorBoard does (for assertions)."""

from __future__ import annotations

import pathlib


def steps_by_tag(log_dir: pathlib.Path) -> dict[str, list[int]]:
  """{tag: steps in file order} of the scalars TensorBoard shows for `log_dir`."""
  from tensorboard.backend.event_processing import event_accumulator
  accumulator = event_accumulator.EventAccumulator(
      str(log_dir), size_guidance={event_accumulator.TENSORS: 0},
      purge_orphaned_data=False)  # Show duplicates instead of hiding some.
  accumulator.Reload()
  return {tag: [e.step for e in accumulator.Tensors(tag)]
          for tag in accumulator.Tags()["tensors"]}
