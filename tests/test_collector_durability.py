"""The collector's durability under faults: what is acknowledged is durable, and every span is accounted for.

* fault injection: ``kill -9`` of a collector process under load, three times, and a count of the spans acknowledged
  against the spans stored (zero loss); a PostgreSQL network partition through a TCP proxy that goes silent
  (spooling, ``database_up`` 0, ``/readyz`` and ``/api/v1`` answering 503 within their timeouts, replay after the
  partition, a shutdown during the partition); an outage of many spool segments replayed through a ``kill -9``;
* one collector per data directory, migrations under one lock, ingest on its own threads (a slow disk starves no
  probe), alert routes answering 503 while the database is down.

The same promises in process, unit by unit (the write-ahead spool, group commit, rejections, the spool limit,
database timeouts), are ``tests/test_collector_write_ahead.py``'s.

Process tests bind 127.0.0.1 on free ports and stop what they start.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.pool import NullPool

from inferwatch.collector.api.app import create_app
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.store import db
from inferwatch.collector.store.datadir import DataDirInUse
from inferwatch.collector.store.rows import record_from_json
from inferwatch.core import vocabulary as V
from tests.conftest import ROOT, free_port, postgres_schema, served_in_thread
from tests.support.collector_process import Collector, Load
from tests.support.durability import PB, metric, row_count, spool_lines, stored_span_ids, wait_until
from tests.support.spans import SpanBodies
from tests.support.tcp_proxy import TcpProxy

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


# --- kill -9 under load ----------------------------------------------------------------------------------------------


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
