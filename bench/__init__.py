"""Benchmarks (each prints its figures and exits non-zero when its target ratio is missed)."""
