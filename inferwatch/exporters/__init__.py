"""Sidecar exporters: scrape an LLM engine and re-expose its metrics in the canonical vocabulary."""
