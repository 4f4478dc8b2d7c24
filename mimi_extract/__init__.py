"""mimi-extract: padding-aware batched Mimi feature and code extraction."""

__version__ = "0.1.0"

from .writer import read, read_manifest  # noqa: E402

__all__ = ["__version__", "read", "read_manifest"]
