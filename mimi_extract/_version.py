"""The package's version (pyproject.toml's), importable without the rest of the package."""

__version__ = "0.3.1"
