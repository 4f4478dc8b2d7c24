"""A module imported at its first use, and not before (nor put in ``sys.modules`` until then).

``audio`` computes with torch (resampling, chunk buffers), but what reading headers needs of it
(``sources`` probing every item, ``mimi-extract plan``) is torch-free, and importing torch costs
seconds: ``from .lazy import torch`` there defers it to the first ``torch.<name>``."""

from __future__ import annotations

import importlib


class LazyModule:
    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        value = getattr(importlib.import_module(self._name), attr)
        setattr(self, attr, value)  # (attribute lookups find it directly from now on)
        return value


torch = LazyModule("torch")
