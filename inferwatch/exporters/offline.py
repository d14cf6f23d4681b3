"""Translate captured payloads without a live engine (``inferwatch exporter translate``)."""

from __future__ import annotations

from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.mapping import EngineAdapter, TranslateContext
from inferwatch.exporters.render import render
from inferwatch.exporters.runtime import with_health
from inferwatch.exporters.samples import Snapshot
from inferwatch.exporters.targets import AUTO


class UndetectableEngine(ValueError):
    """The payload does not reveal its engine (for example an empty body)."""


def resolve_adapter(registry: EngineRegistry, text: str, engine: str) -> EngineAdapter:
    """The adapter of ``engine``, or of the engine detected from ``text`` for ``auto``."""
    if engine != AUTO:
        return registry.get(engine)
    adapter = registry.detect(text)
    if adapter is None:
        hint = "the payload is empty" if not text.strip() else "no known engine's metric names were found"
        raise UndetectableEngine(f"cannot tell which engine produced the payload: {hint}; pass --engine")
    return adapter


def render_with_health(snap: Snapshot, ctx: TranslateContext, target: str, duration: float) -> str:
    return render(with_health(snap, target, ctx.engine, dict(ctx.extra_labels), duration), ctx.vocabulary)
