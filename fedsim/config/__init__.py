"""Typed parameters (base layer): frozen dataclasses parsed from plain YAML data,
used by every registry entry. The experiment config built from them lives in
`fedsim.experiment.config`."""
