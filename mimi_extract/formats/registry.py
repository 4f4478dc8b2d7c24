"""Format name -> :class:`~mimi_extract.formats.base.Format`, in the manner of lhotse's
``features/io.py`` (``register_writer`` / ``get_writer``).  Kept apart from ``__init__`` so that
the run directory (``store/``) can ask for every registered format without an import cycle."""

from __future__ import annotations

from .base import Format

_FORMATS: dict[str, Format] = {}


def register(cls: type[Format]) -> type[Format]:
    """Class decorator: make a format available by its ``name`` (``--format NAME``), offered in the
    order of its ``order`` (then of registration)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _FORMATS[cls.name] = cls()
    ordered = sorted(_FORMATS.items(), key=lambda kv: kv[1].order)
    _FORMATS.clear()
    _FORMATS.update(ordered)
    return cls


def get_format(name: str) -> Format:
    try:
        return _FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown output format {name!r}; choose one of: {', '.join(_FORMATS)}") from None


def formats() -> list[Format]:
    return list(_FORMATS.values())


def names() -> list[str]:
    return list(_FORMATS)


def format_of(name: str) -> Format | None:
    """The format whose committed shard name ``name`` is (relative to its run directory)."""
    for fmt in _FORMATS.values():
        if fmt.is_shard(name):
            return fmt
    return None
