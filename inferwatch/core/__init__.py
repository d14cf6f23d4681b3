"""The bottom layer: the canonical vocabulary and the configuration every component shares.

Nothing in :mod:`inferwatch.core` imports a component (exporters, collector, generators, simulator)
or the command line; ``make lint`` (import-linter) keeps it so.
"""
