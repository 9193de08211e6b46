"""A builder module that fails on import (the `keras` entry must say so in one line)."""

raise RuntimeError("broken on purpose")
