"""What a tap stores per second: the one frame-rate rule (every shard records the number it gives,
``frame_rate``; the cuts' ``frame_shift`` is its inverse)."""

from __future__ import annotations

import math


def frame_rate(tap: str, config=None) -> float:
    """Frames per second of ``tap``: 25 Hz before the downsample (``encoder``), 12.5 Hz after
    (``latent``, ``codes``).  ``config``: a loaded model's (its sampling rate over its strides, and
    its ``frame_rate``), else Mimi's, which every Mimi config has (the tests' tiny one too: Mimi's
    strides with small widths)."""
    if config is not None:
        return float(config.sampling_rate / math.prod(config.upsampling_ratios)) if tap == "encoder" \
            else float(config.frame_rate)
    return 25.0 if tap == "encoder" else 12.5


def frame_shift(tap: str) -> float:
    """Seconds per frame of ``tap`` (a lhotse ``TemporalArray``'s ``frame_shift``): 0.04 or 0.08."""
    return 1 / frame_rate(tap)
