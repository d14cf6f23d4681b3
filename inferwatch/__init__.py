"""inferwatch core: the canonical vocabulary, configuration and the command line."""

__version__ = "0.1.0"
