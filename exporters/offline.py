"""Translate captured payloads without a live engine (``exporter translate``, fixtures, the demo)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.engines import tgi as tgi_engine
from inferwatch.exporters.engines import trtllm as trtllm_engine
from inferwatch.exporters.mapping import EngineAdapter, TranslateContext, translate_text
from inferwatch.exporters.model import Snapshot
from inferwatch.exporters.render import render
from inferwatch.exporters.runtime import with_health


class UndetectableEngine(ValueError):
    """The payload does not reveal its engine (for example an empty body)."""


def resolve_adapter(registry: EngineRegistry, text: str, engine: str) -> EngineAdapter:
    if engine != "auto":
        return registry.get(engine)
    adapter = registry.detect(text)
    if adapter is None:
        hint = "the payload is empty" if not text.strip() else "no known engine's metric names were found"
        raise UndetectableEngine(f"cannot tell which engine produced the payload: {hint}; pass --engine")
    return adapter


def translate_payload(adapter: EngineAdapter, text: str, ctx: TranslateContext) -> Snapshot:
    """One payload -> canonical snapshot (JSON for trtllm-serve's iteration stats, text otherwise)."""
    if adapter.name == trtllm_engine.ADAPTER.name and text.lstrip()[:1] in ("[", "{"):
        return trtllm_engine.json_only_snapshot(json.loads(text), ctx)
    return translate_text(adapter, text, ctx)


def render_with_health(snap: Snapshot, ctx: TranslateContext, target: str, duration: float) -> str:
    return render(with_health(snap, target, ctx.engine, dict(ctx.extra_labels), duration), ctx.vocabulary)


def load_fixture_meta(directory: Path) -> dict[str, Any]:
    meta = yaml.safe_load((directory / "fixture.yaml").read_text())
    if not isinstance(meta, dict):
        raise ValueError(f"{directory}/fixture.yaml must be a mapping")
    return meta


def fixture_context(
    directory: Path, meta: dict[str, Any], adapter: EngineAdapter, vocabulary: V.Vocabulary
) -> TranslateContext:
    ctx = TranslateContext(engine=adapter.name, vocabulary=vocabulary, model_override=meta.get("model"))
    if meta.get("info") and adapter.parse_info is not None:
        ctx.facts = adapter.parse_info(json.loads((directory / str(meta["info"])).read_text()))
    if meta.get("max_batch_total_tokens"):
        ctx.options = {tgi_engine.OPTION_MAX_BATCH_TOTAL_TOKENS: int(meta["max_batch_total_tokens"])}
    return ctx


def fixture_payloads(meta: dict[str, Any]) -> list[str]:
    payloads = meta.get("payloads") or [meta["payload"]]
    return [str(p) for p in payloads]


def translate_fixture(
    directory: Path,
    payload: str,
    registry: EngineRegistry,
    vocabulary: V.Vocabulary,
    duration: float | None = 0.0,
) -> str:
    """Canonical exposition of one fixture payload; ``duration`` fixed so that output is stable."""
    meta = load_fixture_meta(directory)
    text = (directory / payload).read_text()
    adapter = registry.get(str(meta["engine"]))
    ctx = fixture_context(directory, meta, adapter, vocabulary)
    start = time.perf_counter()
    snap = translate_payload(adapter, text, ctx)
    took = time.perf_counter() - start if duration is None else duration
    return render_with_health(snap, ctx, payload, took)
