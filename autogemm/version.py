"""autogemm's version, in a module of its own so that nothing needs the package root to read it."""

__version__ = "0.2.0"
