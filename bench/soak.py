"""Soak: a collector under steady OTLP load for N minutes; every acknowledged span stored, memory bounded.

``inferwatch collector serve`` runs as its own process on a fresh data directory (SQLite, or
``--database-url``), listening on 127.0.0.1 only. Sender threads post OTLP/HTTP protobuf bodies of
vLLM ``llm_request`` spans (the real capture's attributes, fresh ids) at ``--rate`` spans/s, and count
a span as acknowledged when its export is answered 200 without rejections. The collector's RSS
(``/proc/<pid>/status``) is sampled every ``--sample-seconds``. At the end the senders stop, the
collector is stopped with SIGTERM (a clean shutdown), and the spans stored in the database are
counted against the acknowledged ones.

Prints the RSS over time and ``sent / acknowledged / stored / lost``. Exit status 1 when an acknowledged
span is missing from the database, or when the RSS grew by more than ``--max-rss-growth-mib`` between the
end of the warm-up (the first quarter) and the end; 2 when the collector could not be started.

    python -m bench.soak --minutes 2           # `make soak` (CI-friendly default: 1 minute)
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from sqlalchemy import select

from inferwatch.collector.store import db
from inferwatch.collector.store.tables import REQUEST_TABLE
from inferwatch.core import vocabulary as V
from inferwatch.demo import free_ports
from tests.support.spans import SpanBodies

ROOT = Path(__file__).resolve().parent.parent
PB = "application/x-protobuf"


@dataclass
class Tally:
    sent: int = 0
    acked: set[str] = field(default_factory=set)
    refused: dict[int | str, int] = field(default_factory=dict)
    """spans of exports not acknowledged, by HTTP status (or the connection error)."""
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def sender(
    base: str, bodies: SpanBodies, tally: Tally, stop: threading.Event, interval: float, replica: int, n: int
) -> None:
    with httpx.Client(base_url=base, timeout=15) as client:
        next_at = time.monotonic()
        while not stop.is_set():
            body, ids = bodies.body(n, instance=f"replica-{replica}")
            started = time.monotonic()
            outcome: int | str
            try:
                r = client.post("/v1/traces", content=body, headers={"content-type": PB})
                ok = (
                    r.status_code == 200
                    and ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans == 0
                )
                outcome = 200 if ok else r.status_code
            except httpx.HTTPError as exc:
                outcome = exc.__class__.__name__
            with tally.lock:
                tally.sent += len(ids)
                tally.latencies.append(time.monotonic() - started)
                if outcome == 200:
                    tally.acked.update(ids)
                else:
                    tally.refused[outcome] = tally.refused.get(outcome, 0) + len(ids)
            next_at = max(next_at + interval, time.monotonic() - interval)
            stop.wait(max(0.0, next_at - time.monotonic()))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def metric(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def start_collector(data_dir: Path, url: str | None, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "inferwatch", "collector", "serve", "--data-dir", str(data_dir)]
    cmd += ["--listen", f"127.0.0.1:{port}", "--grpc-listen", f"127.0.0.1:{free_ports(1, 0)[0]}"]
    cmd += ["--log-level", "warning"]
    if url:
        cmd += ["--database-url", url]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"the collector did not start: {err[-2000:]}")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=1.0, help="duration of the load (default 1)")
    parser.add_argument("--rate", type=float, default=1000.0, help="spans per second, all senders (default 1000)")
    parser.add_argument("--senders", type=int, default=4, help="concurrent senders, one replica each (default 4)")
    parser.add_argument("--per-body", type=int, default=50, help="spans per export (default 50)")
    parser.add_argument("--sample-seconds", type=float, default=5.0, help="RSS sampling interval (default 5)")
    parser.add_argument("--max-rss-growth-mib", type=float, default=64.0, help="allowed growth after warm-up")
    parser.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite in a fresh directory)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="inferwatch-soak-"))
    port = free_ports(1, 0)[0]
    base = f"http://127.0.0.1:{port}"
    try:
        proc = start_collector(tmp, args.database_url, port)
    except RuntimeError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
        return 2
    bodies = SpanBodies(service="soak")
    tally = Tally()
    stop = threading.Event()
    interval = args.senders * args.per_body / args.rate
    threads = [
        threading.Thread(target=sender, args=(base, bodies, tally, stop, interval, i, args.per_body), daemon=True)
        for i in range(args.senders)
    ]
    duration = args.minutes * 60
    samples: list[tuple[float, float, int, float]] = []
    failed = False
    try:
        started = time.monotonic()
        for t in threads:
            t.start()
        print(f"soak: {args.rate:g} spans/s for {args.minutes:g} min into {base} (pid {proc.pid}, {tmp})")
        print(f"{'t (s)':>6} {'RSS (MiB)':>10} {'acked':>9} {'queue':>6} {'p99 answer (ms)':>16}")
        while (elapsed := time.monotonic() - started) < duration:
            time.sleep(min(args.sample_seconds, max(0.0, duration - elapsed)))
            rss = rss_mib(proc.pid)
            with tally.lock:
                acked = len(tally.acked)
                recent = sorted(tally.latencies[-200:])
            p99 = recent[max(0, int(len(recent) * 0.99) - 1)] * 1000 if recent else 0.0
            queue = int(metric(base, V.COLLECTOR_QUEUE_DEPTH.name))
            samples.append((time.monotonic() - started, rss, acked, p99))
            print(f"{samples[-1][0]:6.0f} {rss:10.1f} {acked:9d} {queue:6d} {p99:16.1f}", flush=True)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        engine = db.make_engine(args.database_url or db.default_url(tmp))
        try:
            with engine.connect() as conn:
                stored = {r[0] for r in conn.execute(select(REQUEST_TABLE.c.span_id))}
        finally:
            engine.dispose()
        lost = tally.acked - stored
        latencies = sorted(tally.latencies)
        p50, p99 = statistics.median(latencies) * 1000, latencies[int(len(latencies) * 0.99) - 1] * 1000
        print(
            f"sent {tally.sent}, acknowledged {len(tally.acked)}, stored {len(stored)}, lost {len(lost)}; "
            f"not acknowledged {sum(tally.refused.values())} {tally.refused or ''}; "
            f"answer p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        )
        if lost:
            print(f"FAIL: {len(lost)} acknowledged spans are not stored", file=sys.stderr)
            failed = True
        warm = [s for s in samples if s[0] >= duration / 4]
        if len(warm) >= 2:
            growth = warm[-1][1] - warm[0][1]
            print(f"RSS after warm-up {warm[0][1]:.1f} MiB -> end {warm[-1][1]:.1f} MiB (growth {growth:+.1f} MiB)")
            if growth > args.max_rss_growth_mib:
                print(f"FAIL: RSS grew by more than {args.max_rss_growth_mib:g} MiB", file=sys.stderr)
                failed = True
        if len(tally.acked) < 0.5 * args.rate * duration:
            print("FAIL: fewer than half the spans sent were acknowledged", file=sys.stderr)
            failed = True
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print("FAIL" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
