"""The collector's write-ahead path, in process: what is acknowledged is durable, and every span is accounted for.

An export is answered only once its records are in the spool (fsync'd) or the database; concurrent exports share
one fsync (group commit); a stuck writer's in-flight batch survives the shutdown; records the database would refuse
are rejected before the answer (``partial_success`` and the metric), those it refuses anyway are counted; the spool
limit turns into 503; database timeouts. The same promises under ``kill -9`` and a network partition are
``tests/test_collector_durability.py``'s.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.pool import NullPool

from inferwatch.collector.api.app import create_app
from inferwatch.collector.ingest.pipeline import CollectorMetrics, Ingestor
from inferwatch.collector.ingest.sources import MappedBatch
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.store import db, inserts
from inferwatch.collector.store.record import RequestRecord
from inferwatch.collector.store.rows import record_from_json
from inferwatch.collector.store.writer import Writer
from inferwatch.core import vocabulary as V
from tests.conftest import postgres_schema
from tests.helpers import value
from tests.support.durability import PB, row_count, spool_lines, stored_span_ids, wait_until
from tests.support.spans import SpanBodies

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


# --- helpers -------------------------------------------------------------------------------------------------------


def record(i: int, **values: Any) -> RequestRecord:
    fields: dict[str, Any] = {
        "trace_id": f"{1:032x}",
        "span_id": f"{i + 1:016x}",
        "engine": "vllm",
        "start_time": T0 + timedelta(milliseconds=i),
        "end_time": T0 + timedelta(milliseconds=i, seconds=1),
        "request_id": f"req-{i}",
    }
    fields.update(values)
    return RequestRecord(**fields)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield db.default_url(tmp_path / "store")
        return
    with postgres_schema("iw_dur") as url:
        yield url


@pytest.fixture
def store(db_url: str) -> Iterator[Engine]:
    engine = db.make_engine(db_url)
    db.ensure_schema(engine)
    yield engine
    engine.dispose()


def export_of(n: int) -> ExportTraceServiceRequest:
    """A request whose only use is its span count (the mapper seam makes the records)."""
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[Span() for _ in range(n)])])]
    )


# --- acknowledged means durable ------------------------------------------------------------------------------------


def test_an_export_is_answered_only_once_its_records_are_durable(store: Engine, tmp_path: Path) -> None:
    """The answer comes after the records are fsync'd to the spool, even while the database insert is still
    running; killed then, a restart replays them."""
    release = threading.Event()

    def slow_insert(engine: Engine, records: Sequence[RequestRecord]) -> tuple[int, int]:
        release.wait(10)
        return inserts.insert_records(engine, records)

    spool = tmp_path / "spool.jsonl"
    writer = Writer(store, spool, insert=slow_insert)
    five = MappedBatch(records=[record(i) for i in range(5)])
    ingestor = Ingestor(writer, CollectorMetrics(), mapper=lambda _req: five)
    writer.start()
    try:
        result = ingestor.ingest(export_of(5))
        assert (result.accepted, result.rejected, result.backpressure) == (5, 0, False)
        # answered: the records are on disk already, though not yet in the database
        assert [record_from_json(line).span_id for line in spool_lines(spool)] == [record(i).span_id for i in range(5)]
        assert row_count(store) == 0
    finally:
        release.set()
        assert writer.stop()
    assert row_count(store) == 5
    assert spool.stat().st_size == 0  # written, then the spool truncated


def test_concurrent_exports_share_one_fsync(store: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Group commit: while one caller fsyncs the spool, the others write and wait; the next fsync covers them
    all. The answers never wait for the database (its inserts are slow here)."""
    fsyncs: list[int] = []
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        fsyncs.append(fd)
        time.sleep(0.02)  # a slow disk: the others queue up behind this fsync
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)

    def slow_insert(engine: Engine, records: Sequence[RequestRecord]) -> tuple[int, int]:
        time.sleep(0.05)
        return inserts.insert_records(engine, records)

    writer = Writer(store, tmp_path / "spool.jsonl", insert=slow_insert)
    counter = iter(range(10_000))
    lock = threading.Lock()

    def mapper(_req: ExportTraceServiceRequest) -> MappedBatch:
        with lock:
            return MappedBatch(records=[record(next(counter)) for _ in range(10)])

    ingestor = Ingestor(writer, CollectorMetrics(), mapper=mapper)
    writer.start()
    try:
        with ThreadPoolExecutor(max_workers=16) as pool:
            results = list(pool.map(lambda _: ingestor.ingest(export_of(10)), range(48)))
    finally:
        assert writer.stop()
    assert all(r.accepted == 10 and not r.backpressure for r in results)
    assert len(fsyncs) < 48 / 2  # group commit: several exports per fsync
    assert row_count(store) == 480


def test_the_batch_in_flight_of_a_stuck_writer_survives_the_shutdown(store: Engine, tmp_path: Path) -> None:
    """A database call that never returns (no deadline reaches it) holds 200 records: stop() gives up on the thread
    and they are in the spool, to be replayed by the next start."""
    stuck = threading.Event()
    never = threading.Event()

    def hanging_insert(_engine: Engine, _records: Sequence[RequestRecord]) -> tuple[int, int]:
        stuck.set()
        never.wait(30)
        raise OperationalError("insert", {}, Exception("gave up"))

    spool = tmp_path / "spool.jsonl"
    writer = Writer(store, spool, insert=hanging_insert)
    writer.start()
    first = [record(i) for i in range(200)]
    assert writer.submit(first)
    assert stuck.wait(10)
    later = [record(i) for i in range(200, 250)]
    assert writer.submit(later)  # queued behind the stuck batch
    assert not writer.stop(timeout=0.5)  # did not finish: the rest spooled from here
    never.set()
    spooled = {record_from_json(line).span_id for line in spool_lines(spool)}
    assert spooled == {r.span_id for r in first + later}
    restarted = Writer(store, spool)
    assert restarted.stop()  # never started: replays inline
    assert row_count(store) == 250


# --- every span accounted for ---------------------------------------------------------------------------------------


def test_values_the_database_cannot_store_are_rejected_before_the_answer(store: Engine, tmp_path: Path) -> None:
    """A token count beyond int64 (both back ends), and on PostgreSQL a NUL character or NaN among the
    attributes: rejected with a reason in the answer and in the metric, nothing acknowledged that is not stored."""
    postgres = store.dialect.name == "postgresql"
    bad = [
        record(0, prompt_tokens=2**63),
        record(1, generation_tokens=-(2**63) - 1),
        record(2, n=2**63),
    ]
    if postgres:
        bad += [
            record(3, model="llama\x00"),
            record(4, attributes={"k": "a\x00b"}),
            record(5, attributes={"x": [1.0, float("nan")]}),
            record(6, n=2**31),
        ]
    good = [record(100 + i) for i in range(3)]
    writer = Writer(store, tmp_path / "spool.jsonl")
    metrics = CollectorMetrics()
    ingestor = Ingestor(writer, metrics, mapper=lambda _req: MappedBatch(records=[*bad, *good]))
    writer.start()
    try:
        result = ingestor.ingest(export_of(len(bad) + len(good)))
    finally:
        assert writer.stop()
    assert (result.accepted, result.rejected) == (len(good), len(bad))
    assert "prompt_tokens out of range for the database" in result.message
    assert stored_span_ids(store) == {r.span_id for r in good}
    ingestor.refresh()
    exposition = generate(metrics)
    assert value(exposition, V.COLLECTOR_SPANS_REJECTED.name) == len(bad)
    assert value(exposition, V.COLLECTOR_SPANS_REJECTED.name, reason="prompt_tokens out of range for the database") == 1
    assert writer.snapshot().rejected == 0  # nothing reached the database to be refused there


def test_records_the_database_refuses_after_the_answer_are_counted(store: Engine, tmp_path: Path) -> None:
    """Whatever the database still refuses (here: a constraint it enforces) is counted by reason, and kept."""

    def picky_insert(engine: Engine, records: Sequence[RequestRecord]) -> tuple[int, int]:
        if any(r.model == "refused" for r in records):
            raise IntegrityError("insert", {}, Exception("violates a check constraint"))
        return inserts.insert_records(engine, records)

    writer = Writer(store, tmp_path / "spool.jsonl", insert=picky_insert)
    metrics = CollectorMetrics()
    records = [record(i, model="refused" if i == 3 else "m") for i in range(8)]
    ingestor = Ingestor(writer, metrics, mapper=lambda _req: MappedBatch(records=records))
    writer.start()
    try:
        result = ingestor.ingest(export_of(8))
        assert result.accepted == 8  # written ahead: answered before the insert
    finally:
        assert writer.stop()
    assert row_count(store) == 7
    reason = "database refused after acknowledgement: Exception"
    assert writer.snapshot().rejected_reasons == {reason: 1}
    assert [record_from_json(line).span_id for line in spool_lines(writer.rejected_path)] == [records[3].span_id]
    ingestor.refresh()
    assert value(generate(metrics), V.COLLECTOR_SPANS_REJECTED.name, reason=reason) == 1


def generate(metrics: CollectorMetrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_an_out_of_range_token_count_over_http_is_a_partial_success(backend: str, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        url = None if backend == "sqlite" else stack.enter_context(postgres_schema("iw_dur"))
        settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, database_url=url)
        client = stack.enter_context(TestClient(create_app(settings)))
        factory = SpanBodies(service="durability", instance="d")
        body, _ = factory.body(3, overrides={"gen_ai.usage.prompt_tokens": str(2**64)})
        good, good_ids = factory.body(2)
        for payload, rejected in ((body, 3), (good, 0)):
            r = client.post("/v1/traces", content=payload, headers={"content-type": PB})
            assert r.status_code == 200
            assert ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans == rejected
        engine = client.app.state.collector.engine  # type: ignore[attr-defined]
        assert client.app.state.collector.writer.flush(10)  # type: ignore[attr-defined]
        assert stored_span_ids(engine) == set(good_ids)
        metrics = client.get("/metrics").text
        assert value(metrics, V.COLLECTOR_SPANS_REJECTED.name) == 3


def test_a_full_spool_turns_into_503(tmp_path: Path) -> None:
    unreachable = create_engine(f"sqlite:///{tmp_path / 'missing' / 'dir' / 'store.db'}", poolclass=NullPool)
    writer = Writer(unreachable, tmp_path / "spool.jsonl", spool_max_bytes=2000, retry_interval=60)
    batches = iter(range(10))

    def three_more(_req: ExportTraceServiceRequest) -> MappedBatch:
        i = next(batches)
        return MappedBatch(records=[record(10 * i + j) for j in range(3)])

    ingestor = Ingestor(writer, CollectorMetrics(), mapper=three_more)
    writer.start()
    try:
        wait_until(lambda: not writer.db_ok, 10, "the start-up probe fails")
        statuses = []
        for _ in range(10):
            result = ingestor.ingest(export_of(3))
            statuses.append("503" if result.backpressure and result.unavailable else "ok")
        assert not writer.db_ok
        assert statuses[0] == "ok" and statuses[-1] == "503"
        assert writer.spool.size() < 2000 + 3000  # the limit, give or take the batch that crossed it
    finally:
        writer.stop()
        unreachable.dispose()


# --- timeouts ---------------------------------------------------------------------------------------------------------


def test_sqlite_statement_deadline_and_busy_timeout(tmp_path: Path) -> None:
    engine = db.make_engine(db.default_url(tmp_path), db.DbTimeouts(statement=0.5, busy=0.25))
    endless = text("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c")
    try:
        with engine.connect() as conn:
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 250
            started = time.monotonic()
            with pytest.raises(OperationalError, match="interrupted") as caught:
                conn.execute(endless)
            assert time.monotonic() - started < 5
            assert db.is_unreachable(caught.value)
            with db.deadline(0.1), pytest.raises(OperationalError):
                conn.execute(endless)
            assert conn.execute(text("SELECT 1")).scalar() == 1  # the connection is still usable
    finally:
        engine.dispose()


def test_postgres_timeouts_are_set_and_the_url_wins() -> None:
    with postgres_schema("iw_dur") as url:
        engine = db.make_engine(url, db.DbTimeouts(statement=3, connect=4))
        own = db.make_engine(make_url(url).update_query_dict({"options": "-c statement_timeout=1234"}))
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SHOW statement_timeout")).scalar() == "3s"
                assert conn.execute(text("SHOW search_path")).scalar().startswith("iw_dur")  # type: ignore[union-attr]
                with pytest.raises(OperationalError, match="statement timeout"):
                    conn.execute(text("SELECT pg_sleep(10)"))
            with own.connect() as conn:
                assert conn.execute(text("SHOW statement_timeout")).scalar() == "1234ms"
        finally:
            engine.dispose()
            own.dispose()
