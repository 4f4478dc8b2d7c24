"""mimi-extract: padding-aware batched Mimi feature and code extraction."""

__version__ = "0.2.0"

__all__ = ["__version__", "read", "read_manifest", "read_cuts"]


def __getattr__(name):  # lazy: `import mimi_extract` stays cheap (the CLI's Ctrl-C handling relies on it)
    if name in ("read", "read_manifest"):
        from . import writer

        return getattr(writer, name)
    if name == "read_cuts":
        from .lhotse_io import read_cuts

        return read_cuts
    raise AttributeError(name)
