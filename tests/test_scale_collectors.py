"""Scale-out of the request store (issue 14): stateless collector replicas behind a real load balancer.

Three ``inferwatch collector serve`` processes share one PostgreSQL schema, each with a data directory
of its own; Debian's haproxy balances OTLP/HTTP over them round robin, health-checking ``/readyz``.
Four exporter threads send vLLM-shaped ``llm_request`` spans (the real capture's attributes, 64 per
export, every span with its own trace and span id) through haproxy and retry as the OTLP specification
asks: on 429, 502, 503, 504 and connection errors, with exponential backoff, ``Retry-After`` honoured.
Connection errors matter: when a replica dies with a request in flight, haproxy (2.6) answers 502 if
the request was the first on the client's connection, but closes a reused keep-alive connection
without any answer.

**The guarantee tested: every span the fleet answered 2xx for is stored exactly once, also when a
replica is SIGKILLed mid-load and restarted on its data directory.** It rests on three properties of
the collector, each exercised here:

- an export is answered 2xx only once its spans are durable, i.e. committed to the database or appended
  to the replica's write-ahead spool (``spool.jsonl`` in its data directory) and fsync'd; a replica
  starting on that data directory replays the spool first, as one restarted by an orchestrator does;
- the store is idempotent on (trace_id, span_id): a unique constraint and ``INSERT … ON CONFLICT DO
  NOTHING``. An export sent again after its answer was lost, or a spool replayed after its batch was
  committed, adds no row. That is what makes the exporter's retries safe; haproxy itself only re-sends
  what never reached a replica (``retry-on conn-failure``, redispatched to another one);
- replicas starting together against an empty schema migrate it once (an advisory lock).

Not guaranteed: spans acknowledged by a replica whose data directory is lost with it. Until the replica
is back, they are durable only on its disk (the spool is local, not shared). Each replica needs a data
directory of its own: nothing stops two replicas from sharing one, and then one replica truncating the
spool after its commit can drop the other's acknowledged, uncommitted spans.

To make the kill land when it matters, after the replica acknowledged spans and before it committed
them, the test holds a SHARE lock on the request table for a moment (a database that stalls briefly),
kills the replica once its spool holds spans that were answered 2xx, then lets the database go on.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from sqlalchemy import Engine, create_engine, select, text, tuple_
from sqlalchemy.pool import NullPool

from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.store.tables import REQUEST_TABLE
from inferwatch.core import vocabulary as V
from inferwatch.demo import free_ports
from tests.conftest import postgres_schema
from tests.helpers import value
from tests.support.haproxy import SERVED_BY, BalancerConfig, HAProxy, Server, haproxy_binary
from tests.support.spans import build_bodies
from tests.support.stack import Processes, collector_cmd

REPLICAS: Final = 3
SENDERS: Final = 4
SPANS_PER_EXPORT: Final = 64
PROTOBUF: Final = "application/x-protobuf"
RETRYABLE: Final = frozenset({429, 502, 503, 504})
"""The OTLP/HTTP statuses a client retries (plus connection errors)."""
BACKOFF_S: Final = (0.05, 1.0)
"""First and largest wait between two attempts of an export (doubling, with jitter)."""
EXPORT_DEADLINE_S: Final = 30.0
"""An exporter gives an export up after this long."""

Key = tuple[str, str]
"""(trace_id, span_id) in hex, as the store keeps them."""
T = TypeVar("T")


# --- the spans ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Export:
    body: bytes
    keys: frozenset[Key]


class SpanSource:
    """Export number ``i``: 64 vLLM ``llm_request`` spans with fresh trace and span ids (and request ids).

    The templates are the bodies bench/collector.py sends (``tests.support.spans.build_bodies``: the real vLLM
    capture's attributes); copying one and giving it new ids costs a fraction of a millisecond, so exporters can
    make exports for as long as a test needs load.
    """

    TEMPLATES: Final = 8

    def __init__(self, seed: int) -> None:
        self.seed = seed
        bodies = build_bodies(self.TEMPLATES * SPANS_PER_EXPORT, SPANS_PER_EXPORT, seed=seed)
        self._templates = [ExportTraceServiceRequest.FromString(body) for body in bodies]

    def __call__(self, i: int) -> Export:
        rng = random.Random(f"{self.seed}/{i}")
        request = ExportTraceServiceRequest()
        request.CopyFrom(self._templates[i % len(self._templates)])
        keys = set()
        spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
        for n, span in enumerate(spans):
            span.trace_id = rng.randbytes(16)
            span.span_id = rng.randbytes(8)
            keys.add((span.trace_id.hex(), span.span_id.hex()))
            for attribute in span.attributes:
                if attribute.key == "gen_ai.request.id":
                    attribute.value.string_value = f"cmpl-{self.seed}-{i}-{n}"
        assert len(keys) == len(spans) == SPANS_PER_EXPORT
        return Export(request.SerializeToString(), frozenset(keys))

    def take(self, count: int) -> list[Export]:
        return [self(i) for i in range(count)]


# --- the exporters --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ack:
    served_by: str
    at: float


@dataclass
class Exporters:
    """``SENDERS`` threads POSTing exports to ``url``, each export until it is answered 2xx (or given up).

    Export ``i`` is ``source(i)``; the threads go on until ``limit`` exports were taken, or until ``stop``.
    """

    url: str
    source: Callable[[int], Export]
    limit: int | None = None
    threads: int = SENDERS
    exports: list[Export] = field(default_factory=list)
    """every export taken, by number."""
    owner: dict[Key, int] = field(default_factory=dict)
    """the export each span is in."""
    acked: dict[int, Ack] = field(default_factory=dict)
    attempts: int = 0
    failures: list[tuple[float, str]] = field(default_factory=list)
    """(when, what): every attempt answered with a retryable status or failed to connect."""
    refused: dict[int, str] = field(default_factory=dict)
    """exports answered with a status not worth retrying, or with spans rejected."""
    gave_up: list[int] = field(default_factory=list)
    crashed: list[BaseException] = field(default_factory=list)
    started: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.started = time.monotonic()
        for n in range(self.threads):
            worker = threading.Thread(target=self._run, name=f"exporter-{n}", daemon=True)
            self._workers.append(worker)
            worker.start()

    def join(self, timeout: float = 60.0) -> None:
        """Wait for the threads: they finish the export in hand (with its retries) and stop."""
        end = time.monotonic() + timeout
        for worker in self._workers:
            worker.join(max(0.0, end - time.monotonic()))
        alive = [w.name for w in self._workers if w.is_alive()]
        assert not alive, f"exporters still running after {timeout:g} s: {alive}"
        assert not self.crashed, f"an exporter thread crashed: {self.crashed[0]!r}"

    @property
    def sent(self) -> int:
        """Exports taken by a thread (sent at least once)."""
        return len(self.exports)

    def keys(self, exports: Iterable[int]) -> set[Key]:
        return set().union(*(self.exports[i].keys for i in exports))

    def acked_keys(self) -> set[Key]:
        with self._lock:
            acked = list(self.acked)
        return self.keys(acked)

    def acked_by(self, served_by: str, since: float = 0.0) -> set[int]:
        """The exports ``served_by`` answered 2xx (from ``since`` on)."""
        with self._lock:
            return {i for i, a in self.acked.items() if a.served_by == served_by and a.at >= since}

    def _take(self) -> int | None:
        with self._lock:
            i = len(self.exports)
            if self.stop.is_set() or (self.limit is not None and i >= self.limit):
                return None
            export = self.source(i)
            self.exports.append(export)
            self.owner.update(dict.fromkeys(export.keys, i))
            return i

    def _run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=20.0) as client:
                while (i := self._take()) is not None:
                    self._send(client, i)
        except BaseException as exc:  # reported by join
            self.crashed.append(exc)

    def _send(self, client: httpx.Client, i: int) -> None:
        rng = random.Random(i)
        delay, longest = BACKOFF_S
        deadline = time.monotonic() + EXPORT_DEADLINE_S
        while True:
            with self._lock:
                self.attempts += 1
            retry_after: float | None = None
            try:
                r = client.post("/v1/traces", content=self.exports[i].body, headers={"content-type": PROTOBUF})
            except httpx.TransportError as exc:
                what = type(exc).__name__
            else:
                if r.is_success:
                    rejected = ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans
                    with self._lock:
                        if rejected:
                            self.refused[i] = f"{rejected} spans rejected"
                        self.acked[i] = Ack(r.headers.get(SERVED_BY, "?"), time.monotonic())
                    return
                if r.status_code not in RETRYABLE:
                    with self._lock:
                        self.refused[i] = f"{r.status_code} {r.text[:200]}"
                    return
                what = str(r.status_code)
                with contextlib.suppress(ValueError):
                    retry_after = float(r.headers.get("retry-after", ""))
            with self._lock:
                self.failures.append((time.monotonic(), what))
            if time.monotonic() > deadline:
                with self._lock:
                    self.gave_up.append(i)
                return
            time.sleep(retry_after if retry_after is not None else delay * rng.uniform(0.5, 1.5))
            delay = min(delay * 2, longest)


def export_all(url: str, exports: list[Export]) -> tuple[Exporters, float]:
    """Send every export to ``url``; the exporters and the spans acknowledged per second."""
    exporters = Exporters(url, exports.__getitem__, limit=len(exports))
    exporters.start()
    exporters.join()
    elapsed = max(a.at for a in exporters.acked.values()) - exporters.started
    return exporters, len(exports) * SPANS_PER_EXPORT / elapsed


# --- the fleet ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replica:
    name: str
    port: int
    grpc_port: int
    data_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def spool(self) -> Path:
        return CollectorSettings(data_dir=self.data_dir).spool_path()

    def cmd(self, database_url: str) -> list[str]:
        return collector_cmd(
            self.port, self.grpc_port, self.data_dir, "--database-url", database_url, "--log-level", "warning"
        )


@dataclass
class Fleet:
    procs: Processes
    database_url: str
    engine: Engine
    replicas: list[Replica]
    balancer: HAProxy

    def start(self, replica: Replica, name: str) -> None:
        """Start ``replica`` as process ``name`` (a restart gets a name, and a log, of its own)."""
        self.procs.spawn(name, replica.cmd(self.database_url))
        self.procs.wait_http(name, f"{replica.url}/readyz", timeout=30)

    def kill(self, name: str) -> float:
        """SIGKILL the process group of ``name`` (a process this fleet started): no chance to flush anything.
        The monotonic time of the signal."""
        proc = self.procs.procs.pop(name)
        at = time.monotonic()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        return at

    def stored(self) -> Counter[Key]:
        """Every stored (trace_id, span_id) with its number of rows."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(REQUEST_TABLE.c.trace_id, REQUEST_TABLE.c.span_id)).all()
        return Counter((str(t), str(s)) for t, s in rows)

    def stored_of(self, keys: Iterable[Key]) -> set[Key]:
        """Those of ``keys`` that are stored."""
        wanted = list(keys)
        if not wanted:
            return set()
        pair = tuple_(REQUEST_TABLE.c.trace_id, REQUEST_TABLE.c.span_id)
        with self.engine.connect() as conn:
            rows = conn.execute(select(REQUEST_TABLE.c.trace_id, REQUEST_TABLE.c.span_id).where(pair.in_(wanted)))
            return {(str(t), str(s)) for t, s in rows}

    def stored_covering(self, keys: set[Key], timeout: float = 20.0) -> Counter[Key]:
        """:meth:`stored` once it holds every one of ``keys`` (the replicas drain their queues meanwhile)."""
        end = time.monotonic() + timeout
        while True:
            stored = self.stored()
            lost = missing(stored, keys)
            if not lost or time.monotonic() > end:
                return stored
            time.sleep(0.1)

    def metric(self, replica: Replica, name: str) -> float:
        return value(httpx.get(f"{replica.url}/metrics", timeout=5).text, name)

    def duplicates(self) -> float:
        """Spans the running replicas found already stored (``inferwatch_collector_duplicate_requests_total``)."""
        return sum(self.metric(r, V.COLLECTOR_DUPLICATES.name) for r in self.replicas)


@contextlib.contextmanager
def fleet(tmp_path: Path, replicas: int = REPLICAS) -> Iterator[Fleet]:
    """``replicas`` collectors on one fresh PostgreSQL schema, started at once, behind haproxy; all stopped after."""
    binary = haproxy_binary()
    with postgres_schema("iw_scale") as url:
        procs = Processes(tmp_path / "logs")
        engine = create_engine(url, poolclass=NullPool)
        try:
            ports = free_ports(2 * replicas + 2, 0)
            members = [Replica(f"c{n}", ports[2 * n], ports[2 * n + 1], tmp_path / f"c{n}") for n in range(replicas)]
            for member in members:  # all at once: they find the schema empty together
                procs.spawn(member.name, member.cmd(url))
            for member in members:
                procs.wait_http(member.name, f"{member.url}/readyz", timeout=30)
            config = BalancerConfig(
                port=ports[-2], stats_port=ports[-1], servers=[Server(m.name, m.port) for m in members]
            )
            balancer = HAProxy(procs, binary, config, tmp_path)
            balancer.start()
            balancer.wait_all("UP")
            yield Fleet(procs, url, engine, members, balancer)
        finally:
            procs.close()
            engine.dispose()


def wait_for(what: str, probe: Callable[[], T], timeout: float, interval: float = 0.02) -> T:
    """Until ``probe()`` is truthy; its value. Fails naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not (result := probe()):
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(interval)
    return result


def spool_keys(path: Path) -> set[Key]:
    """The (trace_id, span_id) of every complete line of a collector's spool (a line being written is skipped)."""
    keys: set[Key] = set()
    with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
        for line in f:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                keys.add((record["trace_id"], record["span_id"]))
    return keys


def missing(stored: Counter[Key], keys: Iterable[Key]) -> set[Key]:
    return {k for k in keys if k not in stored}


# --- the tests ------------------------------------------------------------------------------------------------------


def test_three_replicas_migrate_once_and_share_the_load(tmp_path: Path) -> None:
    """Started together on an empty schema, three replicas migrate it once and all become ready; haproxy
    spreads exports over them; everything acknowledged is stored once. Figures: spans/s through haproxy over
    three replicas, and straight to one replica."""
    with fleet(tmp_path) as f:
        with f.engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        assert len(versions) == 1, versions
        for replica in f.replicas:
            assert "Traceback" not in f.procs.log(replica.name), f.procs.log(replica.name)

        exports = SpanSource(seed=1).take(168)
        export_all(f.balancer.url, exports[:8])  # warm-up: connections, caches
        direct, direct_rate = export_all(f.replicas[0].url, exports[8:88])
        balanced, balanced_rate = export_all(f.balancer.url, exports[88:])
        for exporters in (direct, balanced):
            assert not exporters.refused and not exporters.gave_up
        shares = Counter(a.served_by for a in balanced.acked.values())
        assert sorted(shares) == [r.name for r in f.replicas], shares
        assert min(shares.values()) >= 0.25 * len(balanced.exports), f"round robin is uneven: {shares}"

        everything = set().union(*(e.keys for e in exports))
        stored = f.stored_covering(everything)
        assert set(stored) == everything and max(stored.values()) == 1

        # exports sent again (a client whose answers were lost): round robin puts them on other replicas than
        # the first time, and the store keeps one row per (trace_id, span_id)
        before = f.duplicates()
        again, _ = export_all(f.balancer.url, exports[88:94])
        assert len(again.acked) == 6 and not again.refused
        resent = 6 * SPANS_PER_EXPORT
        wait_for("the re-sent spans counted as duplicates", lambda: f.duplicates() - before == resent, 10)
        assert f.stored() == stored
        print(
            f"\nthroughput, {SENDERS} exporters, {SPANS_PER_EXPORT} spans/export: one replica direct "
            f"{direct_rate:,.0f} spans/s; haproxy over {REPLICAS} replicas {balanced_rate:,.0f} spans/s "
            f"({balanced_rate / direct_rate:.2f}x); exports per replica {dict(sorted(shares.items()))}; "
            f"{resent} spans re-sent: all skipped as duplicates, no row added"
        )


def test_a_replica_killed_mid_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """SIGKILL one replica while its spool holds acknowledged, uncommitted spans; the exporters retry
    through haproxy onto the others; the replica restarted on its data directory replays the spool. Every
    span answered 2xx is stored exactly once (see the module docstring for the guarantee and its limits)."""
    with fleet(tmp_path) as f:
        victim = f.replicas[1]
        exporters = Exporters(f.balancer.url, SpanSource(seed=11))
        exporters.start()
        try:
            wait_for("load: 100 exports acknowledged", lambda: len(exporters.acked) >= 100, 30)

            def acked_only_in_spool() -> set[Key]:
                """Spans the victim answered 2xx for that are in its spool and not (yet) in the database."""
                acked = exporters.acked_by(victim.name)
                spooled = {k for k in spool_keys(victim.spool) if exporters.owner.get(k) in acked}
                return spooled - f.stored_of(spooled)

            # the database stalls (inserts wait for the lock); the victim's spool fills with acknowledged spans
            with f.engine.connect() as lock, lock.begin():
                lock.execute(text("SET LOCAL lock_timeout = '5s'"))
                lock.execute(text(f"LOCK TABLE {REQUEST_TABLE.name} IN SHARE MODE"))
                # within ms under load; at worst exports wait out the ingest timeout (8 s), are retried and
                # reach the victim, or the writers give up on the stalled database and spool everything
                # (a batch committed just before the lock was granted can linger in the spool for a moment)
                pending = wait_for(f"{victim.name} acknowledging spans it has only spooled", acked_only_in_spool, 15)
                killed = f.kill(victim.name)
            # the lock is released: the survivors commit; the victim's transaction died uncommitted with it
            in_spool = spool_keys(victim.spool)
            assert pending <= in_spool and not f.stored_of(pending), "died uncommitted, still in the spool"

            f.balancer.wait_status(victim.name, "DOWN")
            down_after = time.monotonic() - killed
            # an orchestrator restarts the replica on its volume, same address
            f.start(victim, f"{victim.name}-restarted")
            ready_after = time.monotonic() - killed
            wait_for("the spool replayed and truncated", lambda: victim.spool.stat().st_size == 0, 15)
            replayed_after = time.monotonic() - killed
            assert not missing(f.stored(), pending), "the restarted replica must store what it acknowledged"
            f.balancer.wait_status(victim.name, "UP")
            back = time.monotonic()
            up_after = back - killed
            wait_for(
                f"{victim.name} answering exports again", lambda: len(exporters.acked_by(victim.name, back)) >= 3, 20
            )
        finally:
            exporters.stop.set()
            exporters.join()

        acked = exporters.acked_keys()
        sent = exporters.keys(range(exporters.sent))
        stored = f.stored_covering(acked)
        duplicates = {k: n for k, n in stored.items() if n > 1}
        dedup = {r.name: f.metric(r, V.COLLECTOR_DUPLICATES.name) for r in f.replicas}

        assert not exporters.refused, exporters.refused
        assert not exporters.gave_up, f"{len(exporters.gave_up)} exports given up"
        assert len(exporters.acked) == exporters.sent  # each export sent was answered 2xx in the end
        assert not missing(stored, acked), "acknowledged spans lost"
        assert not duplicates, f"{len(duplicates)} spans stored more than once"
        assert set(stored) <= sent, "rows of spans nobody sent"
        assert len(stored) == len(acked)

        failures_after_kill = [t for t, _ in exporters.failures if t >= killed]
        last_failure = max(failures_after_kill, default=killed) - killed
        balancer = f.balancer.servers()[victim.name]
        print(
            f"\nkill test: exports sent {exporters.sent} ({len(sent)} spans), acknowledged {len(exporters.acked)} "
            f"({len(acked)} spans); attempts {exporters.attempts}, retried {exporters.attempts - exporters.sent} "
            f"({dict(Counter(w for _, w in exporters.failures))}); stored {len(stored)} rows, "
            f"{len(stored) - len(acked)} unacknowledged extra, {len(duplicates)} duplicates; "
            f"victim's spool at the kill: {len(in_spool)} spans, {len(pending)} acknowledged and uncommitted, "
            f"replayed on restart; duplicates skipped by the store {dedup}"
        )
        print(
            f"recovery after SIGKILL: {len(failures_after_kill)} client-visible failures, the last "
            f"{last_failure * 1000:.0f} ms after the kill; haproxy redispatched {balancer['wredis']} requests that "
            f"could not reach the replica; haproxy marks it "
            f"DOWN {down_after:.2f} s; restarted then, ready {ready_after:.2f} s (start-up "
            f"{ready_after - down_after:.2f} s), spool replayed "
            f"{replayed_after:.2f} s, back in rotation (UP) {up_after:.2f} s; exports per replica "
            f"{dict(sorted(Counter(a.served_by for a in exporters.acked.values()).items()))}"
        )
