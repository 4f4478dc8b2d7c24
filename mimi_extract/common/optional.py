"""Optional dependencies, imported when first needed with one clear message when missing.

Light on purpose (no torch): the reader and the light commands use it too."""

from __future__ import annotations

import importlib

_EXTRAS = {"lhotse": "lhotse", "pyarrow": "parquet", "matplotlib": "report", "megatron": "megatron"}


class MissingDependency(RuntimeError, ValueError):
    """An optional dependency is not installed.  Also a ValueError: the input side reported a missing
    pyarrow as one, and the light commands (``report``, ``status``) catch ValueError as a usage error."""


def need(module: str, what: str):
    """``module`` imported, or a :class:`MissingDependency` saying ``what`` needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        extra = _EXTRAS.get(module.split(".")[0])
        how = f"pip install 'mimi-extract[{extra}]'" if extra else f"pip install {module.split('.')[0]}"
        raise MissingDependency(f"{what} need {module}: {how} ({e})") from None


def lhotse():
    return need("lhotse", "lhotse manifests and cuts")


def pyarrow(what: str):
    """pyarrow with ``pyarrow.parquet`` imported (``pa.parquet``): Parquet inputs and Parquet shards."""
    pa = need("pyarrow", what)
    need("pyarrow.parquet", what)
    return pa
