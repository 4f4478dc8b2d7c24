"""mimi-extract: padding-aware batched Mimi feature and code extraction."""

from ._version import __version__

__all__ = ["__version__", "open", "read", "read_manifest", "read_cuts", "Reader", "megatron_blend"]


def __getattr__(name):  # lazy: `import mimi_extract` stays cheap (the CLI's Ctrl-C handling relies on it)
    if name in ("open", "read", "read_cuts", "Reader", "megatron_blend"):
        from .readers import reader

        return getattr(reader, name)
    if name == "read_manifest":
        from .store import manifest

        return manifest.read_manifest
    raise AttributeError(name)
