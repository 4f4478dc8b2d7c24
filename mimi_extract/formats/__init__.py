"""Output formats: one small interface (``base.py``), one module per format, and a registry keyed by
name.  The run directory they are written into (lock, manifest, commit protocol, resume) is
``mimi_extract.store``.

    from mimi_extract.formats import get_format, names
    fmt = get_format("hdf5")          # ValueError naming the choices if unknown
    names()                           # what --format offers

To add a format, read ``base.py`` (what to implement, what you are guaranteed), write
``formats/NAME.py`` with a ``@register``-ed :class:`Format` subclass, and import it below.
"""

from __future__ import annotations

from .base import Format, ShardBuilder, array_checksum
from .registry import formats, get_format, names, register

DEFAULT = "hdf5"

from . import hdf5, parquet, shar, megatron  # noqa: E402,F401  (each registers itself, in --format's order)

__all__ = ["Format", "ShardBuilder", "array_checksum", "formats", "get_format", "names", "register", "DEFAULT"]
