"""Output formats: one small interface (``base.py``), one module per format, and a registry keyed by
name.  The run directory they are written into (lock, manifest, commit protocol, resume) is
``mimi_extract.store``.

    from mimi_extract.formats import get_format, names
    fmt = get_format("hdf5")          # ValueError naming the choices if unknown
    names()                           # what --format offers

To add a format, read ``base.py`` (what to implement, what you are guaranteed) and write
``formats/NAME.py`` with a ``@register``-ed :class:`Format` subclass: every module of this folder is
imported here, so it is offered by ``--format`` (in the order of ``Format.order``) with no other change.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Format, ShardBuilder, array_checksum
from .registry import formats, get_format, names, register

DEFAULT = "hdf5"

for _module in pkgutil.iter_modules(__path__):  # each format module registers itself
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Format", "ShardBuilder", "array_checksum", "formats", "get_format", "names", "register", "DEFAULT"]
