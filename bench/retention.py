"""Benchmark: how long the collector's writer stalls while the retention deletes old requests.

A store holds ``--rows`` requests older than the retention (default 200,000) and ``--recent`` newer ones
(100,000), on SQLite and on PostgreSQL (unless ``--no-postgres``); a writer with a one-day retention starts a
pass while a feeder offers fresh spans at ``--rate`` per second. The writer is one thread: while it deletes
it does not insert, so the longest retention step is its longest stall. Measured in the same run:

* **before**: the whole pass in one call (``delete_older_than``: 10,000-row transactions back to back),
  as the writer ran it until now;
* **after**: the writer's own retention, steps sized to about 30 ms each, inserts served between them.

**Target: the longest stall under 100 ms** (after). Checked in every pass, before and after: it ended, it
deleted exactly the old requests (``--rows``), none older than the retention is left, and the table holds the
recent requests plus every span stored meanwhile. Prints the longest step, the pass's duration and rate, and the
inserts meanwhile; exits 1 on a miss (and when PostgreSQL cannot be reached while ``CI`` is set).
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, func, select, text

from inferwatch.collector.store import db, inserts, retention
from inferwatch.collector.store.record import RequestRecord
from inferwatch.collector.store.rows import Prepared
from inferwatch.collector.store.tables import REQUEST_TABLE
from inferwatch.collector.store.writer import Writer

TARGET_STALL_S = 0.1
DEFAULT_WRITE_TIMEOUT_S = inspect.signature(Writer).parameters["write_timeout"].default
"""The collector's deadline on one write, for the pass in steps (as the collector runs)."""
PASS_LIMIT_S = 300.0
"""A pass still running after this long is stopped and reported: the benchmark never waits for ever."""
PG_URL = os.environ.get("INFERWATCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
RETENTION = timedelta(days=1)


def records(first: int, n: int, start: datetime) -> list[RequestRecord]:
    """``n`` vLLM-like requests with fresh ids (``first``…), starting at ``start`` one millisecond apart."""
    out = []
    for i in range(first, first + n):
        begin = start + timedelta(milliseconds=i % 1_000_000)
        out.append(
            RequestRecord(
                trace_id=f"{i:032x}",
                span_id=f"{i:016x}",
                engine="vllm",
                start_time=begin,
                end_time=begin + timedelta(seconds=1.2),
                request_id=f"cmpl-{i}",
                model=f"m{i % 4}",
                instance=f"host-{i % 8}",
                time_to_first_token=0.05 + (i % 97) / 1000,
                time_per_output_token=0.02,
                request_duration=1.2,
                request_queue=0.001 * (i % 13),
                prompt_tokens=100 + i % 50,
                generation_tokens=31,
                attributes={"gen_ai.request.top_p": 1.0},
            )
        )
    return out


def populate(engine: Engine, n: int, recent: int) -> None:
    old = datetime.now(UTC) - RETENTION - timedelta(days=1)
    new = datetime.now(UTC) - timedelta(hours=2)
    for first, count, start in ((0, n, old), (n, recent, new)):
        for i in range(first, first + count, 5000):
            batch = Prepared.of(records(i, min(5000, first + count - i), start), engine.dialect.name)
            inserts.insert_rows(engine, batch.rows)


def one_pass(engine: Engine, spool: Path, *, whole: bool, rate: float, first_id: int) -> dict[str, float]:
    """Run one retention pass under load; its figures."""
    delete = (lambda e, cutoff, _limit: retention.delete_older_than(e, cutoff)) if whole else retention.delete_oldest
    # The whole pass runs without the deadline on one write that came later (5 s): on a slow machine it
    # takes longer, is interrupted, and starts over for ever, as the writer never ran it.
    writer = Writer(
        engine,
        spool,
        retention=RETENTION,
        retention_interval=3600,
        delete_older=delete,
        write_timeout=PASS_LIMIT_S if whole else DEFAULT_WRITE_TIMEOUT_S,
    )
    stop = threading.Event()
    offered = [0]

    def feed() -> None:
        i, per = first_id, 100
        next_at = time.monotonic()
        while not stop.is_set():
            writer.offer(records(i, per, datetime.now(UTC)))
            i += per
            offered[0] += per
            next_at += per / rate
            stop.wait(max(0.0, next_at - time.monotonic()))

    feeder = threading.Thread(target=feed)
    started = time.monotonic()
    writer.start()
    feeder.start()
    finished = True
    try:
        while writer.snapshot().retention_steps == 0 or writer.retention_running:
            if time.monotonic() - started > PASS_LIMIT_S:
                finished = False
                break
            time.sleep(0.01)
        took = time.monotonic() - started
    finally:
        stop.set()
        feeder.join()
        writer.stop()
    stats = writer.snapshot()
    t = REQUEST_TABLE
    with engine.connect() as conn:
        old = select(func.count()).select_from(t).where(t.c.start_time < datetime.now(UTC) - RETENTION)
        left = conn.execute(old).scalar_one()
        total = conn.execute(select(func.count()).select_from(t)).scalar_one()
    return {
        "longest": stats.retention_longest_step,
        "steps": stats.retention_steps,
        "deleted": stats.retention_deleted,
        "seconds": took,
        "stored": stats.stored,
        "offered": offered[0],
        "finished": finished,
        "left": left,
        "total": total,
    }


def wrong(f: dict[str, float], rows: int, recent: int) -> list[str]:
    """What a pass did other than delete exactly the ``rows`` old requests and keep everything else."""
    out = []
    if not f["finished"]:
        out.append(f"the pass did not end within {PASS_LIMIT_S:.0f} s")
    if f["deleted"] != rows:
        out.append(f"{f['deleted']:,.0f} rows deleted, not the {rows:,} old ones")
    if f["left"]:
        out.append(f"{f['left']:,.0f} rows older than the retention left")
    if f["total"] != recent + f["stored"]:
        out.append(f"{f['total']:,.0f} rows left, not the {recent:,} recent ones + {f['stored']:,.0f} stored meanwhile")
    return out


def measure(make_url: Callable[[], str], tmp: Path, args: argparse.Namespace, label: str) -> bool:
    ok = True
    for r in range(args.rounds):
        for whole in (True, False):
            engine = db.make_engine(make_url())
            try:
                db.ensure_schema(engine)
                populate(engine, args.rows, args.recent)
                spool = tmp / f"spool-{uuid.uuid4().hex[:6]}.jsonl"
                f = one_pass(engine, spool, whole=whole, rate=args.rate, first_id=10_000_000 * (r + 1))
            finally:
                engine.dispose()
            name = "before (whole pass)" if whole else "after (steps)     "
            print(
                f"  {label} round {r + 1} {name}: longest stall {f['longest'] * 1000:7.1f} ms, "
                f"{f['deleted']:,.0f} rows deleted in {f['steps']:.0f} step(s), pass {f['seconds']:.2f} s "
                f"({f['deleted'] / f['seconds']:,.0f} rows/s), {f['stored']:,.0f} of {f['offered']:,.0f} offered "
                "spans stored meanwhile"
            )
            for problem in wrong(f, args.rows, args.recent):
                print(f"  {label} round {r + 1} {name}: WRONG: {problem}")
                ok = False
            if not whole:
                ok &= f["longest"] < TARGET_STALL_S
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="old requests to delete")
    parser.add_argument("--recent", type=int, default=100_000, help="requests within the retention")
    parser.add_argument("--rate", type=float, default=2_000, help="spans/s offered during the pass")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="inferwatch-retention-"))
    ok = True
    unmeasured = ""
    try:
        counter = iter(range(1000))
        print(
            f"retention of {args.rows:,} old requests (and {args.recent:,} recent ones) while "
            f"{args.rate:,.0f} spans/s arrive"
        )
        ok &= measure(lambda: db.default_url(tmp / f"s{next(counter)}"), tmp, args, "SQLite")
        if not args.no_postgres:
            admin = db.make_engine(PG_URL)
            schemas: list[str] = []

            def fresh() -> str:
                schema = f"iw_ret_{uuid.uuid4().hex[:8]}"
                with admin.begin() as conn:
                    conn.execute(text(f"CREATE SCHEMA {schema}"))
                schemas.append(schema)
                return f"{PG_URL}?options=-csearch_path%3D{schema}"

            try:
                ok &= measure(fresh, tmp, args, "PostgreSQL")
            except Exception as exc:
                if not db.is_unreachable(exc):
                    raise
                print(f"PostgreSQL: not measured ({db.describe(exc)})")
                unmeasured = " (not measured: PostgreSQL)"
                if os.environ.get("CI"):
                    print("FAIL: PostgreSQL unreachable, and CI is set: it must be measured", file=sys.stderr)
                    ok = False
            finally:
                if schemas:
                    with admin.begin() as conn:
                        for schema in schemas:
                            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
                admin.dispose()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not ok:
        print(
            f"FAIL: a pass went wrong, or a retention step stalled the writer for {TARGET_STALL_S * 1000:.0f} ms "
            "or more",
            file=sys.stderr,
        )
        return 1
    print("OK" + unmeasured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
