"""The version of 1bit, written here only: pyproject.toml reads it (dynamic version) and the package re-exports it."""

__version__ = "0.1.0"
