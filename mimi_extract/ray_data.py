"""``from mimi_extract.ray_data import MimiEncode`` (README, docs/long-recordings.md): Mimi in your own
Ray Data pipeline, kept at this documented path; it lives in :mod:`mimi_extract.engines.ray_data`."""

from .engines.ray_data import MimiEncode

__all__ = ["MimiEncode"]
