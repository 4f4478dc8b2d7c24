"""mimi-extract: padding-aware batched Mimi feature and code extraction."""

__version__ = "0.3.0"

__all__ = ["__version__", "open", "read", "read_manifest", "read_cuts", "Reader", "megatron_blend"]


def __getattr__(name):  # lazy: `import mimi_extract` stays cheap (the CLI's Ctrl-C handling relies on it)
    if name in ("open", "read", "read_cuts", "Reader", "megatron_blend"):
        from . import reader

        return getattr(reader, name)
    if name == "read_manifest":
        from .store import manifest

        return manifest.read_manifest
    raise AttributeError(name)
