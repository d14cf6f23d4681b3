"""Engine fixture directories (``tests/fixtures/engines/<engine>/<case>/``): a ``fixture.yaml``
naming the engine, its payload(s), an optional info body and engine options, and the facts the
value tests check; each payload is translated the way ``inferwatch exporter translate`` does it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.mapping import EngineAdapter, EngineSession, TranslateContext
from inferwatch.exporters.offline import render_with_health


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
    return ctx


def fixture_session(meta: dict[str, Any], adapter: EngineAdapter) -> EngineSession:
    """A fresh session with the fixture's engine ``options:``."""
    return adapter.open(meta.get("options") or {})


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
    snap = fixture_session(meta, adapter).translate(text, ctx)
    took = time.perf_counter() - start if duration is None else duration
    return render_with_health(snap, ctx, payload, took)
