"""The collector's durability and fault behaviour: what is acknowledged is durable, and every span is
accounted for.

* unit level: an export is answered only once its records are in the spool (fsync'd) or the database;
  concurrent exports share one fsync (group commit); a stuck writer's in-flight batch survives the
  shutdown; records the database would refuse are rejected before the answer (``partial_success`` and
  the metric), those it refuses anyway are counted; the spool limit turns into 503; database timeouts;
* fault injection: ``kill -9`` of a collector process under load, three times, and a count of the
  spans acknowledged against the spans stored (zero loss); a PostgreSQL network partition through a
  TCP proxy that goes silent (spooling, ``database_up`` 0, ``/readyz`` and ``/api/v1`` answering 503
  within their timeouts, replay after the partition, a shutdown during the partition).

Process tests bind 127.0.0.1 on free ports and stop what they start.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from sqlalchemy import Engine, create_engine, func, make_url, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.pool import NullPool

from inferwatch.collector.api.app import create_app
from inferwatch.collector.ingest.pipeline import CollectorMetrics, Ingestor
from inferwatch.collector.ingest.sources import MappedBatch
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.store import db, inserts
from inferwatch.collector.store.datadir import DataDirInUse
from inferwatch.collector.store.record import RequestRecord
from inferwatch.collector.store.rows import record_from_json
from inferwatch.collector.store.tables import REQUEST_TABLE
from inferwatch.collector.store.writer import Writer
from inferwatch.core import vocabulary as V
from tests.conftest import ROOT, free_port, postgres_schema, served_in_thread
from tests.helpers import value
from tests.support.spans import SpanBodies
from tests.support.tcp_proxy import TcpProxy

PB = "application/x-protobuf"
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


def stored_span_ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {r[0] for r in conn.execute(select(REQUEST_TABLE.c.span_id))}


def row_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(REQUEST_TABLE)).scalar_one())


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``predicate`` held (polling); AssertionError after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def spool_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line] if path.exists() else []


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


# --- kill -9 under load ----------------------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux ``/proc``): the collector's fork server and ingest workers."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text[text.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Collector:
    """``inferwatch collector serve`` as a process, restartable on the same data directory and HTTP port."""

    def __init__(self, data_dir: Path, url: str | None, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.url = url
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        cmd = [
            sys.executable,
            "-m",
            "inferwatch",
            "collector",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--grpc-listen",
            f"127.0.0.1:{free_port()}",
            "--log-level",
            "warning",
        ]
        if self.url:
            cmd += ["--database-url", self.url]
        started = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self.ready, 60, "collector ready")
        return time.monotonic() - started

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"collector exited with {self.proc.returncode}")
        try:
            return httpx.get(self.base + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill9(self) -> None:
        """kill -9 the collector; its worker processes (and their fork server) must end on their own."""
        assert self.proc is not None
        helpers = descendants(self.proc.pid)
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in helpers), 10, "workers gone")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class Load:
    """Senders posting ``rate`` spans/s in bodies of ``per_body``; a span counts as acknowledged on a 200
    without rejections."""

    def __init__(self, base: str, rate: float, per_body: int = 20, senders: int = 4) -> None:
        self.base = base
        self.per_body = per_body
        self.interval = senders * per_body / rate
        self.factory = SpanBodies(seed=7, service="durability", instance="d")
        self.acked: set[str] = set()
        self.sent = 0
        self.failed = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(senders)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=10) as client:
            next_at = time.monotonic()
            while not self.stop.is_set():
                body, ids = self.factory.body(self.per_body)
                ok = False
                try:
                    r = client.post("/v1/traces", content=body, headers={"content-type": PB})
                    ok = (
                        r.status_code == 200
                        and ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans == 0
                    )
                except httpx.HTTPError:
                    pass
                with self.lock:
                    self.sent += len(ids)
                    if ok:
                        self.acked.update(ids)
                    else:
                        self.failed += len(ids)
                next_at = max(next_at + self.interval, time.monotonic() - self.interval)
                self.stop.wait(max(0.0, next_at - time.monotonic()))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_kill_9_under_load_loses_no_acknowledged_span(backend: str, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        url = None if backend == "sqlite" else stack.enter_context(postgres_schema("iw_kill"))
        collector = Collector(tmp_path / "data", url)
        stack.callback(collector.stop)
        collector.start()
        rng = random.Random(3)
        crashes = []
        with Load(collector.base, rate=1000) as load:
            for _ in range(3):
                time.sleep(1.5 + rng.random() * 1.5)
                with load.lock:
                    acked_before = len(load.acked)
                collector.kill9()
                crashes.append(acked_before)
                collector.start()  # replays the spool left by the crash
            time.sleep(1.5)
        collector.stop()  # SIGTERM: a clean shutdown
        engine = db.make_engine(url or db.default_url(tmp_path / "data"))
        try:
            stored = stored_span_ids(engine)
        finally:
            engine.dispose()
    lost = load.acked - stored
    print(
        f"\nkill -9 x3 ({backend}): sent {load.sent}, acknowledged {len(load.acked)}, stored {len(stored)}, "
        f"acknowledged but lost {len(lost)}; acknowledged at each crash {crashes}"
    )
    assert len(load.acked) > 1000  # the load really ran
    assert not lost, f"{len(lost)} acknowledged spans lost"


# --- a PostgreSQL network partition ---------------------------------------------------------------------------------


def metric(http: httpx.Client, name: str) -> float:
    return value(http.get("/metrics").text, name)


def test_postgres_partition_spools_answers_503_and_recovers(tmp_path: Path) -> None:
    with postgres_schema("iw_part") as direct_url, TcpProxy("127.0.0.1", make_url(direct_url).port or 5432) as proxy:
        proxied = make_url(direct_url).set(port=proxy.port).render_as_string(hide_password=False)
        settings = CollectorSettings(
            data_dir=tmp_path,
            grpc_listen=None,
            database_url=proxied,
            db_write_timeout_seconds=2,
            db_statement_timeout_seconds=2,
            db_connect_timeout_seconds=2,
            db_pool_timeout_seconds=2,
            ingest_timeout_seconds=8,
        )
        factory = SpanBodies(seed=11, service="durability", instance="d")
        acked: set[str] = set()
        direct = db.make_engine(direct_url)
        app = create_app(settings)
        writer = app.state.collector.writer
        writer.max_retry_interval = 1.0  # retry often: the test waits for the replay
        writer.probe_interval = 1.0
        timings: dict[str, float] = {}

        def post(http: httpx.Client, n: int) -> httpx.Response:
            body, ids = factory.body(n)
            r = http.post("/v1/traces", content=body, headers={"content-type": PB})
            if r.status_code == 200:
                acked.update(ids)
            return r

        try:
            with served_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as http:
                assert post(http, 50).status_code == 200
                wait_until(lambda: row_count(direct) == 50, 10, "stored before the partition")

                proxy.silence()
                started = time.monotonic()
                r = http.get("/api/v1/requests")  # a pooled connection into the silence: the client-side deadline
                timings["first read into the silence answered (s)"] = time.monotonic() - started
                assert r.status_code == 503 and "database" in r.json()["detail"]
                started = time.monotonic()
                r = post(http, 200)  # the writer's insert hangs: the batch is spooled past the write deadline
                timings["first export in the partition answered (s)"] = time.monotonic() - started
                assert r.status_code == 200
                timings["database_up 0 after (s)"] = (
                    time.monotonic()
                    - started
                    + wait_until(lambda: metric(http, V.COLLECTOR_DB_UP.name) == 0, 15, "database_up 0")
                )
                started = time.monotonic()
                r = http.get("/readyz")
                timings["/readyz answered (s)"] = time.monotonic() - started
                assert r.status_code == 503
                started = time.monotonic()
                r = http.get("/api/v1/requests")
                timings["/api/v1/requests answered (s)"] = time.monotonic() - started
                assert r.status_code == 503 and "database" in r.json()["detail"]
                r = http.get("/api/v1/stats")
                assert r.status_code == 503 and "database" in r.json()["detail"]
                started = time.monotonic()
                for _ in range(5):  # the database known down: straight to the spool
                    assert post(http, 20).status_code == 200
                timings["5 exports while down (s)"] = time.monotonic() - started
                assert len(spool_lines(tmp_path / "spool.jsonl")) >= 300
                assert row_count(direct) == 50

                proxy.resume()
                started = time.monotonic()
                wait_until(lambda: metric(http, V.COLLECTOR_DB_UP.name) == 1, 30, "database_up back to 1")
                timings["replayed after the partition (s)"] = time.monotonic() - started
                assert stored_span_ids(direct) >= acked
                assert http.get("/readyz").status_code == 200

                proxy.silence()  # and a shutdown in the middle of the next partition
                for _ in range(3):
                    assert post(http, 100).status_code == 200
            # served_in_thread stopped the app: whatever was not committed is in the spool
            proxy.resume()
            missing = acked - stored_span_ids(direct)
            assert missing
            assert missing <= {record_from_json(line).span_id for line in spool_lines(tmp_path / "spool.jsonl")}
            restart = CollectorSettings(data_dir=tmp_path, grpc_listen=None, database_url=direct_url)
            with TestClient(create_app(restart)) as client:
                wait_until(lambda: client.get("/readyz").status_code == 200, 10, "ready after restart")
                assert client.app.state.collector.writer.flush(10)  # type: ignore[attr-defined]
            assert stored_span_ids(direct) >= acked
        finally:
            direct.dispose()
    print("\npartition timings:", {k: round(v, 2) for k, v in timings.items()}, f"acknowledged {len(acked)}")
    assert timings["first export in the partition answered (s)"] < 8
    assert timings["/readyz answered (s)"] < 8
    assert timings["/api/v1/requests answered (s)"] < 10
    assert timings["first read into the silence answered (s)"] < 15


def spool_segments(data_dir: Path) -> int:
    """Segment files of the spool in ``data_dir`` (``spool.jsonl``, ``spool.jsonl.1``…)."""
    return sum(1 for f in data_dir.glob("spool.jsonl*") if f.name == "spool.jsonl" or f.suffix[1:].isdigit())


def test_an_outage_of_many_segments_replays_in_full_through_a_kill_9(tmp_path: Path) -> None:
    """A PostgreSQL partition long enough to close many spool segments (64 KiB each here, 64 MiB by default)
    while 1,000 spans/s keep being acknowledged; after healing, ``kill -9`` while the replay is half way
    (some segments committed and deleted, others not); the next start replays the rest. Every acknowledged
    span is stored, once. On the spool before the segment-offset fix the replay skipped the first records of
    a segment that had been emptied and refilled, then looped forever."""
    env = {
        "INFERWATCH_COLLECTOR_SPOOL_SEGMENT_BYTES": str(64 << 10),
        "INFERWATCH_COLLECTOR_BATCH_SIZE": "64",  # small transactions: the replay takes many steps
        "INFERWATCH_COLLECTOR_DB_WRITE_TIMEOUT_SECONDS": "1",
        "INFERWATCH_COLLECTOR_DB_CONNECT_TIMEOUT_SECONDS": "1",
        "INFERWATCH_COLLECTOR_DB_STATEMENT_TIMEOUT_SECONDS": "2",
        "INFERWATCH_COLLECTOR_DB_POOL_TIMEOUT_SECONDS": "1",
    }
    data = tmp_path / "data"
    with contextlib.ExitStack() as stack:
        direct_url = stack.enter_context(postgres_schema("iw_outage"))
        relay = stack.enter_context(TcpProxy("127.0.0.1", make_url(direct_url).port or 5432))
        proxied = make_url(direct_url).set(port=relay.port).render_as_string(hide_password=False)
        collector = Collector(data, proxied, env)
        stack.callback(collector.stop)
        collector.start()
        with Load(collector.base, rate=1000) as load:
            time.sleep(1.0)  # stored as it comes
            relay.silence()
            wait_until(lambda: spool_segments(data) >= 12, 60, "a dozen spool segments during the outage")
            time.sleep(1.0)
        peak = spool_segments(data)
        relay.resume()
        # the writer probes, then replays segment by segment, deleting each once committed: kill it half way
        wait_until(lambda: spool_segments(data) < peak, 60, "the replay under way")
        left = spool_segments(data)
        collector.kill9()
        assert left > 1, f"the replay was over ({left} segment left) before the kill: nothing tested"
        restarted = Collector(data, direct_url, env)
        stack.callback(restarted.stop)
        restarted.start()
        engine = db.make_engine(direct_url)
        stack.callback(engine.dispose)
        wait_until(lambda: spool_segments(data) <= 1 and row_count(engine) >= len(load.acked), 60, "replayed")
        restarted.stop()
        stored = stored_span_ids(engine)
        rows = row_count(engine)
    lost = load.acked - stored
    print(
        f"\noutage of {peak} spool segments, kill -9 with {left} left: sent {load.sent}, acknowledged "
        f"{len(load.acked)}, stored {len(stored)} in {rows} rows, acknowledged but lost {len(lost)}"
    )
    assert len(load.acked) > 2000  # the load really ran through the outage
    assert not lost, f"{len(lost)} acknowledged spans lost"
    assert rows == len(stored), "a span stored twice"


# --- one collector per data directory, migrations under one lock, ingest on its own threads --------------------------


def test_a_second_collector_on_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    """Two collectors sharing a spool could lose acknowledged spans: the second refuses to start, naming the
    directory and the holder; once the first has stopped, it starts."""
    data = tmp_path / "data"
    first = CollectorSettings(data_dir=data, grpc_listen=None)
    with TestClient(create_app(first)):
        second_app = create_app(CollectorSettings(data_dir=data, grpc_listen=None))
        with pytest.raises(DataDirInUse) as refused, TestClient(second_app):
            pass
        assert str(data) in str(refused.value) and f"pid {os.getpid()}" in str(refused.value)
    with TestClient(create_app(CollectorSettings(data_dir=data, grpc_listen=None))) as again:
        assert again.get("/readyz").status_code == 200

    running = Collector(data, None)  # and between processes: `collector serve` exits with the reason
    try:
        running.start()
        assert running.proc is not None
        second = subprocess.run(
            [
                *(sys.executable, "-m", "inferwatch", "collector", "serve", "--data-dir", str(data)),
                *("--listen", f"127.0.0.1:{free_port()}", "--grpc-listen", f"127.0.0.1:{free_port()}"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        message = " ".join(second.stderr.split())
        assert second.returncode == 3, second.stderr
        assert str(data) in message and f"pid {running.proc.pid}" in message
        running.kill9()  # the kernel drops the lock of a dead process: a restart is never refused
        running.start()
    finally:
        running.stop()


def test_db_upgrade_waits_for_the_migration_lock() -> None:
    """`inferwatch db upgrade` takes the PostgreSQL advisory lock collectors take to migrate at start: while
    another holds it, the command waits instead of migrating concurrently."""
    with postgres_schema("iw_mig") as url:
        holder = create_engine(url, poolclass=NullPool)
        engine = db.make_engine(url)
        try:
            with holder.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": db.PG_MIGRATION_LOCK_KEY})
                upgrade = subprocess.Popen(
                    [sys.executable, "-m", "inferwatch", "db", "upgrade", "--database-url", url],
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                try:
                    time.sleep(4)  # the command has started and is waiting for the lock
                    assert upgrade.poll() is None
                    assert db.current_revision(engine) is None
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": db.PG_MIGRATION_LOCK_KEY})
            _, stderr = upgrade.communicate(timeout=60)
            assert upgrade.returncode == 0, stderr
            assert db.at_head(engine)
        finally:
            if upgrade.poll() is None:
                upgrade.kill()
                upgrade.wait(timeout=10)
            engine.dispose()
            holder.dispose()


def test_a_slow_disk_does_not_starve_readyz_or_the_read_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exports waiting for a slow fsync hold the ingest's own threads, not asyncio's default pool: /readyz and the
    read API answer meanwhile (with ingest on the default pool, 6 threads, they queued behind the exports)."""
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(2.5)  # a disk that takes seconds to flush
        real_fsync(fd)

    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None)
    factory = SpanBodies(seed=5, service="durability", instance="d")
    app = create_app(settings)
    with served_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as http:
        assert http.get("/readyz").status_code == 200
        monkeypatch.setattr(os, "fsync", slow_fsync)
        bodies = [factory.body(20)[0] for _ in range(12)]
        with ThreadPoolExecutor(max_workers=12) as senders:
            exports = [
                senders.submit(lambda b: http.post("/v1/traces", content=b, headers={"content-type": PB}), b)
                for b in bodies
            ]
            time.sleep(0.8)  # every export is waiting for the spool's fsync now
            started = time.monotonic()
            ready = http.get("/readyz")
            readyz_s = time.monotonic() - started
            started = time.monotonic()
            listed = http.get("/api/v1/requests")
            read_s = time.monotonic() - started
            waiting = sum(not e.done() for e in exports)
            statuses = [e.result().status_code for e in exports]
        monkeypatch.setattr(os, "fsync", real_fsync)
    print(f"\nwith 12 exports waiting for fsync: /readyz {readyz_s:.3f} s, /api/v1/requests {read_s:.3f} s")
    assert waiting >= 8  # the exports were still waiting while the probes answered
    assert ready.status_code == 200 and readyz_s < 1.0
    assert listed.status_code == 200 and read_s < 1.0
    assert statuses == [200] * 12


def test_alert_routes_answer_503_while_the_database_is_down(tmp_path: Path) -> None:
    """The webhook, the incidents API and the incident page turn an unreachable database into a 503 naming it
    (Alertmanager retries a 5xx), like the read API; not a 500."""
    import sqlite3

    from sqlalchemy import event

    from tests.support.alertmanager import alert, notification

    engine = db.make_engine(db.default_url(tmp_path / "store"))
    down = threading.Event()

    @event.listens_for(engine, "do_connect")
    def refuse(*_args: Any) -> None:
        if down.is_set():
            raise sqlite3.OperationalError("unable to open database file")

    labels = {"engine": "vllm", "model": "llama", "instance": "10.0.0.5:9400", "severity": "page"}
    group = {"alertname": V.ALERT_PREEMPTIONS_SUSTAINED, "model": "llama"}
    note = notification([alert(V.ALERT_PREEMPTIONS_SUSTAINED, labels, starts=T0)], group=group)
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None)
    try:
        with TestClient(create_app(settings, engine=engine)) as client:
            assert client.post("/api/v1/alerts/webhook", json=note).status_code == 200
            incident = client.get("/api/v1/incidents").json()["data"][0]["id"]
            down.set()
            engine.dispose()  # the pooled connections go: every new one fails
            for method, path in (
                ("GET", "/api/v1/incidents"),
                ("GET", f"/api/v1/incidents/{incident}"),
                ("GET", f"/incidents/{incident}"),
                ("POST", "/api/v1/alerts/webhook"),
            ):
                r = client.request(method, path, json=note if method == "POST" else None)
                assert r.status_code == 503, (path, r.status_code, r.text)
                assert r.json()["detail"].startswith("database unavailable"), path
            down.clear()
            assert client.get(f"/api/v1/incidents/{incident}").status_code == 200
    finally:
        engine.dispose()
