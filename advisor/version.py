"""The advisor's version, in a module of its own so that every stage can name it without
importing the package's front door (`advisor/__init__.py`, the Python API)."""

__version__ = "0.1.0"
