"""kvpolicy's version, in a module of its own: the readers stamp their caches with it without
importing the package's API (``kvpolicy.__version__`` is this same value)."""

__version__ = "0.1.0"
