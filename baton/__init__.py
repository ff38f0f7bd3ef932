"""Baton's composition root: the CLI, configuration and launchers."""

__version__ = "0.1.0"
