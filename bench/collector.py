"""Benchmark: collector ingest end to end against the database's own insert limit, and /stats at scale.

1. Limit: the rows of 100k ``llm_request`` spans inserted directly with SQLAlchemy Core in batches of
   512 into a fresh SQLite database (the best the store can do).
2. End to end: ``inferwatch collector serve`` (a separate process, fresh SQLite) receives the same 100k
   spans as OTLP/HTTP protobuf bodies of 512 spans from another process; the rate is stored rows per
   second from the first send until the last row is stored. **Target: >= 0.5x the limit on SQLite.**
   PostgreSQL (the local server, a scratch schema) is measured too and reported.
3. ``/api/v1/stats`` exact percentiles over 1M stored rows on SQLite (target < 1 s), and how it scales.

Prints every figure; exits 1 when the SQLite ratio or the stats target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from sqlalchemy import insert, text

from inferwatch.collector import db
from inferwatch.collector.models import REQUEST_TABLE
from inferwatch.collector.sources import map_export
from inferwatch.collector.store import compute_stats
from inferwatch.collector.writer import record_to_dict
from inferwatch.core import vocabulary as V
from inferwatch.demo import free_ports

ROOT = Path(__file__).resolve().parent.parent
SPANS = ROOT / "tests" / "fixtures" / "otlp" / "vllm-0.32.0-cpu" / "spans.json"
TARGET_RATIO = 0.5
STATS_TARGET_SECONDS = 1.0
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def build_bodies(n: int, batch: int, seed: int = 0) -> list[bytes]:
    """``n`` vLLM-shaped llm_request spans (the real capture's attributes, fresh ids), ``batch`` per body."""
    templates = [s for s in json.loads(SPANS.read_text()) if s["name"] == "llm_request"]
    rng = random.Random(seed)
    t0 = int(time.time() * 1e9) - n * 1_000_000
    bodies = []
    for start in range(0, n, batch):
        spans = []
        for i in range(start, min(n, start + batch)):
            tpl = templates[i % len(templates)]
            attrs = dict(tpl["attributes"])
            attrs["gen_ai.request.id"] = f"cmpl-{i:012x}-0"
            begin = t0 + i * 1_000_000
            spans.append(
                Span(
                    trace_id=rng.randbytes(16),
                    span_id=rng.randbytes(8),
                    name="llm_request",
                    kind=Span.SPAN_KIND_SERVER,
                    start_time_unix_nano=begin,
                    end_time_unix_nano=begin + int(attrs["gen_ai.latency.e2e"] * 1e9),
                    attributes=[_kv(k, v) for k, v in attrs.items()],
                    flags=256,
                )
            )
        req = ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(
                    resource=Resource(attributes=[_kv("service.name", "bench"), _kv("service.instance.id", "b-0")]),
                    scope_spans=[ScopeSpans(scope=InstrumentationScope(name="vllm.tracing.otel"), spans=spans)],
                )
            ]
        )
        bodies.append(req.SerializeToString())
    return bodies


def direct_limit(url: str, bodies: list[bytes], batch: int) -> float:
    """Rows/s of plain SQLAlchemy Core inserts of the same rows, batches of ``batch``."""
    rows = []
    for body in bodies:
        for rec in map_export(ExportTraceServiceRequest.FromString(body)).records:
            d = record_to_dict(rec)
            for k in ("start_time", "end_time"):
                d[k] = datetime.fromisoformat(d[k])
            d["received_at"] = datetime.now(UTC)
            rows.append(d)
    engine = db.make_engine(url)
    db.ensure_schema(engine)
    table = REQUEST_TABLE
    cols = set(table.c.keys())
    rows = [{k: v for k, v in r.items() if k in cols} for r in rows]
    t = time.perf_counter()
    for i in range(0, len(rows), batch):  # one executemany and one commit per batch, as an application would
        with engine.begin() as conn:
            conn.execute(insert(table), rows[i : i + batch])
    took = time.perf_counter() - t
    engine.dispose()
    return len(rows) / took


def end_to_end(url: str | None, data_dir: Path, bodies: list[bytes], n: int) -> float:
    """Rows/s through a collector process, fed by a sender process."""
    port = free_ports(1, 0)[0]
    cmd = [
        sys.executable,
        "-m",
        "inferwatch",
        "collector",
        "serve",
        "--data-dir",
        str(data_dir),
        "--listen",
        f"127.0.0.1:{port}",
        "--grpc-listen",
        f"127.0.0.1:{free_ports(1, 0)[0]}",
        "--log-level",
        "warning",
    ]
    if url:
        cmd += ["--database-url", url]
    collector = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or collector.poll() is not None:
                raise RuntimeError(
                    "collector did not start: " + (collector.stderr.read().decode() if collector.stderr else "")
                )
            time.sleep(0.2)
        body_file = data_dir / "bodies.bin"
        with body_file.open("wb") as f:
            for b in bodies:
                f.write(len(b).to_bytes(4, "big") + b)
        t = time.perf_counter()
        sender = subprocess.Popen([sys.executable, __file__, "--send", base + "/v1/traces", "--bodies", str(body_file)])
        while True:
            if stored_rows(base) >= n:
                break
            if sender.poll() not in (None, 0):
                raise RuntimeError("sender failed")
            time.sleep(0.1)
        took = time.perf_counter() - t
        sender.wait(timeout=60)
        return n / took
    finally:
        collector.terminate()
        collector.wait(timeout=30)


def stored_rows(base: str) -> int:
    """The collector's own count of stored rows (its self-metrics: cheaper than a COUNT over the table)."""
    for line in httpx.get(base + "/metrics", timeout=30).text.splitlines():
        if line.startswith(V.COLLECTOR_REQUESTS_STORED.name + " "):
            return int(float(line.split()[1]))
    return 0


def send(url: str, body_file: Path) -> None:
    """The sender process: POST every body, retrying on 429/503 as OTLP clients do."""
    data = body_file.read_bytes()
    bodies, i = [], 0
    while i < len(data):
        size = int.from_bytes(data[i : i + 4], "big")
        bodies.append(data[i + 4 : i + 4 + size])
        i += 4 + size
    with httpx.Client(timeout=60) as client:
        for body in bodies:
            while True:
                r = client.post(url, content=body, headers={"content-type": "application/x-protobuf"})
                if r.status_code == 200:
                    break
                if r.status_code in (429, 503):
                    time.sleep(float(r.headers.get("retry-after", "0.1")) / 20)
                    continue
                raise SystemExit(f"collector answered {r.status_code}: {r.text[:200]}")


def stats_scaling(tmp: Path, sizes: list[int]) -> list[tuple[int, float]]:
    """Seconds of compute_stats (4 fields x 4 exact percentiles, goodput) over ``size`` rows."""
    engine = db.make_engine(db.default_url(tmp))
    db.ensure_schema(engine)
    table = REQUEST_TABLE
    rng = random.Random(1)
    now = datetime.now(UTC)
    out = []
    have = 0
    for size in sizes:
        rows = []
        for i in range(have, size):
            e2e = rng.lognormvariate(0, 0.5)
            rows.append(
                {
                    "trace_id": uuid.UUID(int=i).hex,
                    "span_id": f"{i:016x}",
                    "engine": "vllm",
                    "model": f"m{i % 4}",
                    "start_time": now - timedelta(seconds=i % 3000),
                    "end_time": now,
                    "received_at": now,
                    "time_to_first_token": e2e * 0.3,
                    "time_per_output_token": 0.01 + rng.random() * 0.02,
                    "request_duration": e2e,
                    "request_queue": e2e * 0.1,
                    "prompt_tokens": 200,
                    "generation_tokens": 100,
                    "ttft_derived": False,
                    "attributes": {},
                }
            )
        with engine.begin() as conn:
            for j in range(0, len(rows), 5000):
                conn.execute(insert(table), rows[j : j + 5000])
        have = size
        with engine.connect() as conn:
            conn.execute(text("ANALYZE"))
        t = time.perf_counter()
        compute_stats(
            engine=engine, window=timedelta(hours=1), slos={"time_to_first_token": 0.5, "request_duration": 2.0}
        )
        out.append((size, time.perf_counter() - t))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--stats-rows", type=int, default=1_000_000)
    parser.add_argument("--send", help=argparse.SUPPRESS)
    parser.add_argument("--bodies", help=argparse.SUPPRESS)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    if args.send:
        send(args.send, Path(args.bodies))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="inferwatch-bench-"))
    failed = False
    try:
        bodies = build_bodies(args.spans, args.batch)
        print(f"{args.spans} llm_request spans in {len(bodies)} OTLP/HTTP protobuf bodies of {args.batch}")
        (tmp / "direct").mkdir()
        limit = direct_limit(db.default_url(tmp / "direct"), bodies, args.batch)
        e2e = end_to_end(None, tmp / "e2e", bodies, args.spans)
        ratio = e2e / limit
        print(
            f"SQLite: direct Core inserts {limit:,.0f} rows/s; collector end to end {e2e:,.0f} rows/s; "
            f"ratio {ratio:.2f} (target >= {TARGET_RATIO})"
        )
        failed |= ratio < TARGET_RATIO
        if not args.no_postgres:
            schema = f"iw_bench_{uuid.uuid4().hex[:8]}"
            pg = f"{PG_URL}?options=-csearch_path%3D{schema}"
            try:
                admin = db.make_engine(PG_URL)
                with admin.begin() as conn:
                    conn.execute(text(f"CREATE SCHEMA {schema}"))
                try:
                    pg_limit = direct_limit(pg, bodies, args.batch)
                    with admin.begin() as conn:
                        conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
                        conn.execute(text(f"CREATE SCHEMA {schema}"))
                    (tmp / "pg").mkdir()
                    pg_e2e = end_to_end(pg, tmp / "pg", bodies, args.spans)
                    print(
                        f"PostgreSQL: direct Core inserts {pg_limit:,.0f} rows/s; collector end to end "
                        f"{pg_e2e:,.0f} rows/s; ratio {pg_e2e / pg_limit:.2f}"
                    )
                finally:
                    with admin.begin() as conn:
                        conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
            except Exception as exc:  # report, do not fail: the target is SQLite's
                print(f"PostgreSQL: not measured ({exc.__class__.__name__}: {str(exc)[:120]})")
        sizes = sorted({args.stats_rows // 4, args.stats_rows // 2, args.stats_rows})
        (tmp / "stats").mkdir()
        for size, seconds in stats_scaling(tmp / "stats", sizes):
            print(f"/api/v1/stats (exact p50/p90/p95/p99 of 4 fields + goodput) over {size:,} rows: {seconds:.3f} s")
            last = seconds
        failed |= last > STATS_TARGET_SECONDS
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        print("FAIL: a target was missed", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
