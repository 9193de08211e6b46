"""Typed parameters (base layer): frozen dataclasses parsed from plain YAML data
(`typed`) and turned back into it (`plain`), used by every registry entry. The
experiment config built from them lives in `fedsim.experiment.config`."""
