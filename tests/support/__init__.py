"""Helpers for tests and benchmarks only (not shipped): a replaying HTTP server, payload
derivations and the translation of engine fixture directories."""
