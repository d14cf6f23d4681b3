"""TensorRT-LLM trtllm-serve: three Prometheus name generations and the JSON iteration stats."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.engines import trtllm as trtllm_engine
from inferwatch.exporters.mapping import ScrapeError, TranslateContext, translate_text
from inferwatch.exporters.samples import Snapshot
from inferwatch.exporters.server import Exporter
from inferwatch.exporters.targets import ExporterConfig, TargetConfig
from tests.conftest import ENGINE_FIXTURES
from tests.helpers import has, value
from tests.support.replay import JSON, TEXT, ReplayServer

D = ENGINE_FIXTURES / "trtllm"


def facts(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((D / name / "fixture.yaml").read_text())["facts"])


def translate(name: str, model: str | None = None) -> Snapshot:
    ctx = TranslateContext(engine=V.ENGINE_TRTLLM, model_override=model)
    return translate_text(trtllm_engine.ADAPTER, (D / name / "prometheus.txt").read_text(), ctx)


@pytest.mark.parametrize("gen", ["gen-a", "gen-b", "gen-c"])
def test_every_generation_detected_and_mapped(gen: str, registry: EngineRegistry) -> None:
    assert registry.detect((D / gen / "prometheus.txt").read_text()) is trtllm_engine.ADAPTER
    f = facts(gen)
    snap = translate(gen)
    by_reason = f["requests_by_finished_reason"]
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_STOP) == by_reason["stop"]
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_LENGTH) == by_reason["length"]
    for spec, key in (
        (V.TIME_TO_FIRST_TOKEN, "ttft"),
        (V.REQUEST_DURATION, "e2e"),
        (V.REQUEST_QUEUE, "queue"),
    ):
        h = snap.histogram(spec)
        assert h is not None, spec.name
        assert h.inf == f[f"{key}_count"]
        assert h.total == pytest.approx(f[f"{key}_sum_seconds"])
    tpot = snap.histogram(V.TIME_PER_OUTPUT_TOKEN)
    assert tpot is not None and tpot.inf == f["tpot_count"]
    # TTFT and TPOT buckets are supersets of OpenTelemetry's: lossless
    assert V.TIME_TO_FIRST_TOKEN not in snap.inexact and V.TIME_PER_OUTPUT_TOKEN not in snap.inexact
    assert snap.unmapped == []


def test_undefined_model_label_is_replaced() -> None:
    snap = translate("gen-a")
    assert {dict(k)[V.LABEL_MODEL] for k in snap.values[V.REQUESTS]} == {V.UNKNOWN}
    snap = translate("gen-a", model="llama-3-8b")
    assert {dict(k)[V.LABEL_MODEL] for k in snap.values[V.REQUESTS]} == {"llama-3-8b"}


def test_gen_b_kv_gauge_with_pid_dropped() -> None:
    f = facts("gen-b")
    snap = translate("gen-b")
    assert snap.value(V.KV_CACHE_USAGE) == pytest.approx(f["kv_cache_utilization"])
    assert all("pid" not in dict(k) for k in snap.values[V.KV_CACHE_USAGE])


def test_gen_c_full() -> None:
    f = facts("gen-c")
    snap = translate("gen-c")
    sel = {V.LABEL_MODEL: f["model_name"]}
    reasons = f["requests_by_finished_reason"]
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_ABORT, **sel) == reasons["cancelled"]
    # timeouts and HTTP 5xx are errors; HTTP 400 validation errors are client errors, not counted
    assert (
        snap.value(V.REQUESTS, outcome=V.OUTCOME_ERROR) == reasons["timeout"] + f["request_errors_by_http_code"]["500"]
    )
    assert snap.value(V.PROMPT_TOKENS) == f["prompt_tokens_total"]
    assert snap.value(V.GENERATION_TOKENS) == f["generation_tokens_total"]
    assert snap.value(V.PREFIX_CACHE_HIT_TOKENS) == f["prompt_cached_tokens_total"]
    assert snap.value(V.PREFIX_CACHE_QUERIED_TOKENS) == f["prompt_tokens_total"]
    assert snap.value(V.REQUESTS_RUNNING) == f["num_requests_running"]
    assert snap.value(V.REQUESTS_WAITING) == f["num_requests_waiting"]
    assert snap.value(V.KV_CACHE_USAGE) == pytest.approx(f["kv_cache_utilization"])
    assert snap.value(V.KV_CACHE_CAPACITY) == f["kv_cache_capacity_tokens"]
    assert snap.value(V.SPEC_DECODE_DRAFT_TOKENS) == f["spec_decode_num_draft_tokens_total"]
    assert snap.value(V.SPEC_DECODE_ACCEPTED_TOKENS) == f["spec_decode_num_accepted_tokens_total"]
    (key,) = snap.values[V.ENGINE_INFO]
    info = dict(key)
    assert info[V.LABEL_BLOCK_SIZE] == str(f["kv_cache_tokens_per_block"])
    assert info[V.LABEL_MAX_CONCURRENCY] == str(f["max_num_active_requests"])
    assert info[V.LABEL_PREFIX_CACHING] == V.TRUE


def test_json_accumulates_across_destructive_reads() -> None:
    f = facts("json-iteration-stats")
    acc = trtllm_engine.IterationStatsAccumulator()
    first = json.loads((D / "json-iteration-stats" / "metrics.json").read_text())
    second = json.loads((D / "json-iteration-stats" / "metrics-next.json").read_text())
    assert acc.feed(first) == f["first_poll"]["iterations"]
    assert acc.feed(first) == 0, "a re-read of the same iterations must not count twice"
    assert acc.feed(second) == f["second_poll"]["iterations"]
    snap = Snapshot()
    acc.apply(TranslateContext(engine=V.ENGINE_TRTLLM, model_override="m"), snap)
    both = f["both_polls"]
    assert snap.value(V.SPEC_DECODE_DRAFT_TOKENS) == both["num_draft_tokens_sum"]
    assert snap.value(V.SPEC_DECODE_ACCEPTED_TOKENS) == both["num_accepted_tokens_sum"]
    latest = f["latest"]
    assert snap.value(V.REQUESTS_RUNNING) == latest["numActiveRequests"]
    assert snap.value(V.REQUESTS_WAITING) == latest["numQueuedRequests"]
    assert snap.value(V.KV_CACHE_USAGE) == pytest.approx(latest["kv_cache_utilization"])
    assert snap.value(V.KV_CACHE_CAPACITY) == latest["maxNumBlocks"] * latest["tokensPerBlock"]
    after = f["latest_after_second_poll"]
    assert snap.value(V.PREFIX_CACHE_HIT_TOKENS) == after["reusedBlocks"] * latest["tokensPerBlock"]
    assert snap.value(V.PREFIX_CACHE_QUERIED_TOKENS) == (after["reusedBlocks"] + after["missedBlocks"]) * 32


@pytest.fixture
def trtllm_gen_a_with_json() -> Iterator[ReplayServer]:
    """A trtllm-serve 1.1-style server: Gen A Prometheus text and the JSON stats at /metrics."""
    server = ReplayServer(
        {
            trtllm_engine.PROMETHEUS_PATH: (TEXT, (D / "gen-a" / "prometheus.txt").read_bytes()),
            trtllm_engine.JSON_PATH: (JSON, (D / "json-iteration-stats" / "metrics.json").read_bytes()),
        }
    )
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("engine", ["auto", "trtllm"])
def test_serve_combines_prometheus_and_json(
    engine: str, registry: EngineRegistry, trtllm_gen_a_with_json: ReplayServer
) -> None:
    target = TargetConfig(url=trtllm_gen_a_with_json.url, engine=engine, model="llama")
    exporter = Exporter(ExporterConfig(listen="127.0.0.1:0", targets=[target]), registry, V.Vocabulary())
    try:
        text = exporter.metrics()
    finally:
        exporter.stop()
    f = facts("json-iteration-stats")
    assert value(text, V.EXPORTER_UP.name, engine=V.ENGINE_TRTLLM) == 1.0
    assert value(text, V.TIME_TO_FIRST_TOKEN.name + "_count", model="llama") == facts("gen-a")["ttft_count"]
    assert value(text, V.REQUESTS_RUNNING.name, model="llama") == f["latest_after_first_poll"]["numActiveRequests"]
    assert trtllm_gen_a_with_json.hits.get(trtllm_engine.JSON_PATH, 0) >= 1
    assert has(text, V.KV_CACHE_CAPACITY.name)


def test_json_detected_and_translated_through_the_session(registry: EngineRegistry) -> None:
    """A captured JSON read goes to trtllm-serve and translates on its own; a session keeps the stats."""
    first = (D / "json-iteration-stats" / "metrics.json").read_text()
    second = (D / "json-iteration-stats" / "metrics-next.json").read_text()
    assert registry.detect(first) is trtllm_engine.ADAPTER
    assert registry.detect("[not json") is None
    session = trtllm_engine.ADAPTER.open({"json_poll_interval_seconds": "0.5"})
    assert isinstance(session, trtllm_engine.TrtllmSession) and session.poll_interval == 0.5
    ctx = TranslateContext(engine=V.ENGINE_TRTLLM, model_override="m")
    session.translate(first, ctx)
    snap = session.translate(second, ctx)
    f = facts("json-iteration-stats")
    assert snap.value(V.SPEC_DECODE_DRAFT_TOKENS) == f["both_polls"]["num_draft_tokens_sum"]
    # the text payload of the same session gets the JSON-derived signals it lacks
    text = session.translate((D / "gen-a" / "prometheus.txt").read_text(), ctx)
    assert text.value(V.REQUESTS_RUNNING) == f["latest"]["numActiveRequests"]
    assert (
        V.REQUESTS_RUNNING
        not in translate_text(trtllm_engine.ADAPTER, (D / "gen-a" / "prometheus.txt").read_text(), ctx).metrics()
    )


def test_scrapes_as_frequent_as_the_interval_do_all_the_draining(
    registry: EngineRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scrape drains the JSON stats unless a drain came within half the interval; a background poll
    drains only an interval after the last poll's drain, 1.25 intervals after a scrape's, and a failed
    drain is retried an interval later (not at once)."""
    now = [100.0]
    monkeypatch.setattr("inferwatch.exporters.engines.trtllm.time", SimpleNamespace(monotonic=lambda: now[0]))
    asked: list[str] = []
    fail = [False]

    def get(path: str, *, allow_404: bool = False) -> str:
        asked.append(path)
        if fail[0]:
            raise ScrapeError("down")
        return "[]" if path == trtllm_engine.JSON_PATH else "# text\n"

    adapter = registry.get(V.ENGINE_TRTLLM)
    session = adapter.open({"json_poll_interval_seconds": 1.0})
    assert isinstance(session, trtllm_engine.TrtllmSession)

    def drains() -> int:
        return asked.count(trtllm_engine.JSON_PATH)

    assert session.poll_delay() == 0.0  # never drained: due now
    session.fetch(get, adapter.default_path)  # a scrape at 100.0 drains
    assert drains() == 1
    now[0] = 100.3
    assert session.poll_delay() == pytest.approx(0.95)  # 1.25 intervals after a scrape's drain
    session.poll(get)  # a poll before it is due does nothing
    assert drains() == 1
    now[0] = 100.4
    session.fetch(get, adapter.default_path)  # 0.4 s after a drain: fresh, no drain
    assert drains() == 1
    now[0] = 100.5
    session.fetch(get, adapter.default_path)  # half the interval: drains, and pushes the poll back
    assert drains() == 2 and session.poll_delay() == pytest.approx(1.25)
    now[0] = 101.5
    session.poll(get)  # an interval after the scrape's drain: the next scrape may still come
    assert drains() == 2
    now[0] = 101.75
    session.poll(get)  # 1.25 intervals, and no scrape came: the poll drains
    assert drains() == 3 and session.poll_delay() == pytest.approx(1.0)  # a poll's: an interval
    fail[0] = True
    now[0] = 102.75
    with pytest.raises(ScrapeError):
        session.poll(get)
    assert drains() == 4 and session.poll_delay() == pytest.approx(1.0)  # retried an interval later


def test_json_signals_are_every_metric_the_stats_can_add() -> None:
    """:data:`JSON_SIGNALS` (what makes a page covered) is exactly what the JSON stats add to a bare
    snapshot: a metric missing from it would leave a covered page without that signal."""
    acc = trtllm_engine.IterationStatsAccumulator()
    acc.feed(json.loads((D / "json-iteration-stats" / "metrics.json").read_text()))
    snap = Snapshot()
    acc.apply(TranslateContext(engine=V.ENGINE_TRTLLM, model_override="m"), snap)
    assert snap.metrics() == trtllm_engine.JSON_SIGNALS


def test_a_covered_page_is_not_drained_and_loses_nothing(
    registry: EngineRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gen C's page carries every signal of the JSON stats: after one such page, scrapes stop draining
    them (one engine request less each), the poll wakes only 10 intervals after the last scrape, and
    the scrape's series are those the JSON stats would have given; a page without them (Gen A) makes
    the next scrape drain again."""
    now = [100.0]
    monkeypatch.setattr("inferwatch.exporters.engines.trtllm.time", SimpleNamespace(monotonic=lambda: now[0]))
    stats = (D / "json-iteration-stats" / "metrics.json").read_text()
    pages = {name: (D / name / "prometheus.txt").read_text() for name in ("gen-a", "gen-c")}
    page = ["gen-c"]
    asked: list[str] = []

    def get(path: str, *, allow_404: bool = False) -> str:
        asked.append(path)
        return stats if path == trtllm_engine.JSON_PATH else pages[page[0]]

    def drains() -> int:
        return asked.count(trtllm_engine.JSON_PATH)

    adapter = registry.get(V.ENGINE_TRTLLM)
    session = adapter.open({"json_poll_interval_seconds": 1.0})
    assert isinstance(session, trtllm_engine.TrtllmSession)
    ctx = TranslateContext(engine=V.ENGINE_TRTLLM)

    def scrape() -> Snapshot:
        return session.translate(session.fetch(get, adapter.default_path), ctx)

    first = scrape()  # not known to be covered yet: drains
    assert drains() == 1 and session.covered and session.stats.iterations > 0
    fresh = adapter.open({})  # the same page without any JSON stats
    assert first.values == fresh.translate(pages["gen-c"], ctx).values
    for step in range(1, 4):
        now[0] = 100.0 + 2 * step
        scrape()
    assert drains() == 1
    assert session.poll_delay() == pytest.approx(10.0)  # 10 intervals after the last scrape
    now[0] = 116.0
    session.poll(get)
    assert drains() == 1 and session.poll_delay() == pytest.approx(10.0)  # the wake only pushes it back
    page[0] = "gen-a"
    now[0] = 117.0
    scrape()  # read while covered: no drain; the page lacks the signals
    assert drains() == 1 and not session.covered
    now[0] = 118.0
    snap = scrape()
    assert drains() == 2
    assert snap.value(V.REQUESTS_RUNNING) == facts("json-iteration-stats")["latest"]["numActiveRequests"]
